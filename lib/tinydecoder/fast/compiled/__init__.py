"""The fast path's compiled kernels (numba; the `fast` extra), each named for what it computes:

    jit                 compiles a kernel once (cached on disk) and binds what it calls; numba's threads
    few_rows            a few rows times a weight matrix, each weight read once (decode steps, checks)
    tiles               many rows times a weight matrix in register tiles (prefill, batches)
    few_queries         attention of a few new rows over a cache (decode steps, checks, a batch's newest rows)
    prefill_attention   attention of a prefill or a long chunk, in register tiles on every core
    vexp                a vectorisable exp for x <= 0 (softmax, SiLU)
    llvm                the inner loops the kernels inline, written in LLVM's IR
    quant_rows          rows times the GGUF file's own Q4_1 / Q8_0 blocks, read in place (quant_dots: its loops;
                        quant_decode: a block decoded in registers; quant_matrix: QuantMatrix, such a tensor
                        as a weight, plain numpy)
    quant_planes        one row times Q4_1 weights laid out in bit planes, by table lookups (a decode step;
                        plane_dots: its loop)
    fma_peak            the cores' multiply-add roof, a compiled loop of them (bench's pass floors)

Each product module (few_rows, tiles, quant_rows) offers the same pair: `rows_times(x, w, out)`,
which checks its arguments, and `product(x, w, out)`, which does not; `fast.forward_pass.
product_kernel` says which of them a pass runs. Importing this package imports nothing compiled:
each kernel module is imported when used.
"""
