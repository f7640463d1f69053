"""All-reduce bus bandwidth through PyTorch's NCCL backend, as nccl-tests
defines it (algbw = bytes / time; busbw = algbw * 2(n-1)/n), for the bucket
sizes mtopt_dist_bench uses: the reference that mtopt's bucket all-reduce is
compared with where nccl-tests itself is not installed.

    python3 -m torch.distributed.run --nproc_per_node 2 bench/nccl_allreduce.py \
        [--sizes-mb 4,25,100,400] [--iters 20]
"""
import argparse
import os
import statistics

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="4,25,100,400")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if rank == 0:
        print(f"# torch {torch.__version__} NCCL {torch.cuda.nccl.version()} world {world}")
        print(f"{'size_MB':>8} {'time_ms':>9} {'algbw_GB/s':>11} {'busbw_GB/s':>11}")
    for mb in [float(x) for x in args.sizes_mb.split(",")]:
        n = int(mb * 1e6 / 4)
        x = torch.randn(n, device="cuda")
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dist.all_reduce(x)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        ms = statistics.median(times)
        algbw = n * 4 / (ms * 1e-3) / 1e9
        if rank == 0:
            print(f"{mb:>8g} {ms:>9.3f} {algbw:>11.1f} {algbw * 2 * (world - 1) / world:>11.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
