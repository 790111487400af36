#!/usr/bin/python3
"""PyTorch Gloo reference for bench-allreduce: all-reduce of a float32 vector
over TCP on loopback, between N local processes.

Measures, for each size, R timed calls of all_reduce(SUM) followed by a
division by N (an average, as ravnest's ring all-reduce computes), after W
untimed warm-up calls. Every call is preceded by a refill of the input and a
barrier, both untimed. A call's time is that of the slowest rank, from leaving
the barrier to holding the average. Rank 0 prints one line per size:

    gloo procs=N mib=M median_s=0.123456 min_s=... max_s=... runs=R

and every rank checks the result; the exit status is non-zero if any is wrong.

Run it with Debian's /usr/bin/python3 (python3-torch):

    tests/bench/allreduce-gloo.py --procs 4 --mib 1 --mib 16 --mib 64 --runs 5
"""
import argparse
import datetime
import os
import socket
import statistics
import sys
import time

# Set before torch loads, here and (inherited) in the spawned children: one
# intra-op thread per process so N processes don't fight over 2 cores, and
# Gloo's sockets on the loopback interface only.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["GLOO_SOCKET_IFNAME"] = "lo"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pattern(n, rank):
    """Rank-dependent input: i % 1024 + rank + 1 (exact in float32)."""
    return torch.arange(n, dtype=torch.float32).remainder_(1024).add_(rank + 1)


def worker(rank, args, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.procs,
                            timeout=datetime.timedelta(seconds=120))
    n = args.procs
    for mib in args.mib:
        count = int(mib * (1 << 20)) // 4
        src = pattern(count, rank)
        # Average of (i % 1024 + r + 1) over r = 0..N-1.
        want = pattern(count, 0).add_((n - 1) / 2)
        x = torch.empty_like(src)
        times = []
        for i in range(args.warmup + args.runs):
            x.copy_(src)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            x.div_(n)
            t = time.perf_counter() - t0
            if i >= args.warmup:
                times.append(t)
            # All partial sums are small integers, so the average is exact.
            if not torch.equal(x, want):
                bad = (x - want).abs().argmax().item()
                raise RuntimeError(f"rank {rank}: wrong result for {mib:g} MiB:"
                                   f" x[{bad}]={x[bad].item()}, want {want[bad].item()}")
        # The slowest rank's time for each run.
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            t = t.tolist()
            print(f"gloo procs={n} mib={mib:g} median_s={statistics.median(t):.6f}"
                  f" min_s={min(t):.6f} max_s={max(t):.6f} runs={args.runs}",
                  flush=True)
        del src, want, x
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, required=True, help="processes (>= 2)")
    p.add_argument("--mib", type=float, action="append", required=True,
                   help="vector size in MiB; repeat for several sizes")
    p.add_argument("--runs", type=int, required=True, help="timed calls per size")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    args = p.parse_args()
    if args.procs < 2 or args.runs < 1 or args.warmup < 0 or min(args.mib) <= 0:
        p.error("need --procs >= 2, --runs >= 1, --warmup >= 0, --mib > 0")
    if not dist.is_available() or not dist.is_gloo_available():
        sys.exit("allreduce-gloo: this torch has no torch.distributed Gloo backend")
    try:
        # Any rank's exception or non-zero exit ends the others and lands here.
        mp.spawn(worker, args=(args, free_port()), nprocs=args.procs)
    except mp.ProcessRaisedException as e:
        sys.exit(f"allreduce-gloo: {e}")
    except mp.ProcessExitedException as e:
        sys.exit(f"allreduce-gloo: {e}")


if __name__ == "__main__":
    main()
