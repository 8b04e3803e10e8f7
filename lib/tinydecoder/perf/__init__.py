"""Speed, measured: `bench` (the model's prefill, decode and batch speeds against this machine's
roofs, with targets), `bench_rows` (passes over a few rows: speculative checks), and `machine`
(the roofs and timers: memory bandwidth, matmul rate, the CPU's name)."""
