#!/usr/bin/python3
"""Data-parallel training with torch DistributedDataParallel whose gradient all-reduce goes through ccoll.

    # one rank per process; rank, size and the root come from the environment (see "Launch" below)
    /usr/bin/python3 examples/train_ddp.py --codec quant:bits=4,mode=requant --log q4.jsonl
    # or all ranks on this machine, for a quick try:
    /usr/bin/python3 examples/train_ddp.py --spawn 4 --codec bf16 --max-steps 50

The task: handwritten digits (scikit-learn's bundled load_digits, 1797 images of 8x8, no download), upsampled to
RES x RES (default 32) and augmented with fixed-seed random affine transforms (rotation, scale, shift) and pixel
noise. The digits are split 80/20 by image before augmenting, so no test image (in any of its augmented copies) is
ever trained on. The model is an MLP on the flattened image (default 1024 -> 2048 -> 2048 -> 10, 6.3 M parameters,
25 MB of float32 gradients a step), large enough that the gradient all-reduce dominates a step at 1 Gbit/s.

--codec chooses how DDP's gradient buckets are averaged over the ranks:
  none     no comm hook: DDP's own all-reduce through gloo, float32 on the wire.
  bf16     the 16-bit baseline: the float32 bucket is rounded to a bfloat16 copy, that copy is all-reduced exactly by
           ccoll (bfloat16 on the wire, op avg) and copied back. This is what a framework that keeps bf16 gradients
           sends, and the baseline of perf/netbench (ccoll exact bfloat16).
  cast16   ccoll's Cast16 compressor on the float32 bucket (bf16 on the wire, float32 accumulation in the ring).
  SPEC     any other ccoll compressor spec through ccoll.torch.allreduce_hook, one compressor (error feedback) per
           bucket: "quant:bits=4,mode=requant", "quant:bits=2,mode=requant", "topk:density=0.01", "powersgd:rank=4".

Optimizer: SGD with momentum 0.9, learning rate 0.05 decayed to 0 over --max-steps (cosine), batch 16 per rank. With 4
ranks (global batch 64) the float32 reference reaches ~95 % test accuracy after ~330 steps and ~96.8 % at 600.

Every rank builds the same data set from the same seed and trains on its own shard (example i belongs to rank
i % WORLD). Every --eval-every steps all ranks stop the clock, evaluate their share of the test set, and sum the
counts; rank 0 appends a JSON line {"time", "step", "epoch", "loss", "acc", ...} to --log. "time" is the training
wall time in seconds since the first step (evaluation excluded, so that a log's curve does not depend on how often
it was evaluated). Training stops after --max-steps, after --max-time seconds of training, or at --target when
--stop-at-target is given; the last line ({"final": true, ...}) holds the final accuracy and the time to target.

Launch: rank and size come from RANK/WORLD_SIZE or else from ccoll's CC_RANK/CC_NRANKS. torch.distributed (gloo:
DDP's parameter broadcast, the evaluation counts and, with --codec none, the gradients) meets at
MASTER_ADDR:MASTER_PORT, by default CC_ROOT's host and CC_ROOT's port + 1. The ccoll communicator comes from
CC_ROOT (ccCommInitFromEnv) when it is set, else from an id that rank 0 broadcasts over gloo (torchrun). With
--spawn N the script starts N local ranks itself (127.0.0.1, ranks talk over loopback / shared memory).
"""

import argparse
import json
import math
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--codec", default="bf16", help="none, bf16, cast16 or a ccoll compressor spec (see above)")
    p.add_argument("--res", type=int, default=32, help="image side after upsampling (input = RES*RES)")
    p.add_argument("--hidden", type=int, default=2048, help="width of each hidden layer")
    p.add_argument("--depth", type=int, default=2, help="number of hidden layers")
    p.add_argument("--augment", type=int, default=16, help="augmented copies of each training image")
    p.add_argument("--test-augment", type=int, default=4, help="augmented copies of each test image")
    p.add_argument("--batch", type=int, default=16, help="batch size per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                   help="learning rate over the steps: cosine decay from --lr to 0 at --max-steps, or constant")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=20, help="steps between evaluations")
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--max-time", type=float, default=600.0, help="seconds of training (evaluation excluded)")
    p.add_argument("--target", type=float, default=0.95, help="target test accuracy (fraction)")
    p.add_argument("--stop-at-target", action="store_true", help="stop at the first evaluation at or above --target")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--async-comm", action="store_true",
                   help="all-reduce the buckets on a background thread (async_op), overlapping the backward pass")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--log", default=None, help="JSON-lines log written by rank 0")
    p.add_argument("--spawn", type=int, default=0, help="start this many local ranks (a quick try without a launcher)")
    return p.parse_args(argv)


# -- data ------------------------------------------------------------------------------------------------------------

def make_data(args):
    """(train_x, train_y, test_x, test_y) as float32 / int64 tensors, identical on every rank."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # (1797, 8, 8) in [0, 1]
    labels = torch.tensor(digits.target, dtype=torch.int64)
    gen = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(len(labels), generator=gen)
    n_test = len(labels) // 5
    test_idx, train_idx = perm[:n_test], perm[n_test:]

    def augment(imgs, ys, copies, seed):
        g = torch.Generator().manual_seed(seed)
        x = F.interpolate(imgs.unsqueeze(1), size=(args.res, args.res), mode="bilinear", align_corners=False)
        x = x.repeat(copies, 1, 1, 1)
        y = ys.repeat(copies)
        m = x.shape[0]
        angle = (torch.rand(m, generator=g) * 2 - 1) * math.radians(15)
        scale = 1 + (torch.rand(m, generator=g) * 2 - 1) * 0.12
        shift = (torch.rand(m, 2, generator=g) * 2 - 1) * 0.15  # of the half-width: ~0.6 of an original pixel
        cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
        theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, padding_mode="zeros", align_corners=False)
        x = x + 0.1 * torch.randn(x.shape, generator=g)
        return x.flatten(1).contiguous(), y

    train_x, train_y = augment(images[train_idx], labels[train_idx], args.augment, args.seed + 1000)
    test_x, test_y = augment(images[test_idx], labels[test_idx], args.test_augment, args.seed + 2000)
    mean, std = train_x.mean(), train_x.std()
    return (train_x - mean) / std, train_y, (test_x - mean) / std, test_y


def make_model(args, n_in):
    import torch
    torch.manual_seed(args.seed)
    layers, width = [], n_in
    for _ in range(args.depth):
        layers += [torch.nn.Linear(width, args.hidden), torch.nn.ReLU()]
        width = args.hidden
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


# -- gradient all-reduce ---------------------------------------------------------------------------------------------

class Bf16State:
    """State of bf16_hook: the communicator (a bf16 copy per bucket is allocated at each call; it is small), and a
    ccoll.torch.CommWorker with async_op, as CcollHookState has."""

    def __init__(self, comm, async_op=False):
        import ccoll.torch
        self.comm = comm
        self.worker = ccoll.torch.CommWorker(comm) if async_op else None  # a failed call aborts comm

    def close(self):
        if self.worker is not None:
            self.worker.close()


def bf16_hook(state, bucket):
    """The 16-bit baseline: exact ccoll all-reduce (avg) of a bfloat16 copy of the float32 bucket."""
    import torch
    import ccoll.torch
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    half = tensor.to(torch.bfloat16)

    def reduce():
        state.comm.all_reduce(half, op="avg")
        tensor.copy_(half)
        return tensor

    return ccoll.torch.future_of(state.worker, reduce)


def timed(hook, clock):
    """Wraps a hook; clock[0] adds up the seconds the backward pass spends in it: this rank's gradient communication
    for a synchronous hook, only the submission with --async-comm (the all-reduces then overlap the backward pass)."""

    def timed_hook(state, bucket):
        t0 = time.perf_counter()
        fut = hook(state, bucket)
        clock[0] += time.perf_counter() - t0
        return fut

    timed_hook.__name__ = hook.__name__  # DDP's hook check reads it
    return timed_hook


# -- one rank --------------------------------------------------------------------------------------------------------

def env_int(*names):
    for name in names:
        if os.environ.get(name):
            return int(os.environ[name])
    raise SystemExit("train_ddp.py: set %s (or use --spawn N)" % " or ".join(names))


def run(args):
    import torch
    import torch.distributed as dist

    rank = env_int("RANK", "CC_RANK")
    world = env_int("WORLD_SIZE", "CC_NRANKS")
    root = os.environ.get("CC_ROOT", "")
    if root and not os.environ.get("MASTER_ADDR"):
        host, _, port = root.rpartition(":")
        os.environ["MASTER_ADDR"] = host
        os.environ.setdefault("MASTER_PORT", str(int(port) + 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    train_x, train_y, test_x, test_y = make_data(args)
    train_x, train_y = train_x[rank::world].contiguous(), train_y[rank::world].contiguous()
    test_x, test_y = test_x[rank::world].contiguous(), test_y[rank::world].contiguous()
    model = make_model(args, train_x.shape[1])
    n_params = sum(p.numel() for p in model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)

    comm, state, clock = None, None, None
    if args.codec != "none":
        import ccoll
        import ccoll.torch
        if os.environ.get("CC_ROOT"):
            comm = ccoll.Communicator.from_env()
        else:
            # The id goes through the process group (public API; launchers differ in who hosts their store).
            uid = [ccoll.get_unique_id() if rank == 0 else None]
            dist.broadcast_object_list(uid, src=0)
            comm = ccoll.Communicator(world, uid[0], rank)
        if args.codec == "bf16":
            state, hook = Bf16State(comm, async_op=args.async_comm), bf16_hook
        else:
            state = ccoll.torch.CcollHookState(comm, spec=args.codec, async_op=args.async_comm)
            hook = ccoll.torch.allreduce_hook
        clock = [0.0]
        ddp.register_comm_hook(state, timed(hook, clock))

    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    log = open(args.log, "w") if (rank == 0 and args.log) else None

    def emit(record):
        if rank == 0:
            line = json.dumps(record)
            print(line, flush=True)
            if log:
                log.write(line + "\n")
                log.flush()

    emit({"config": True, "codec": args.codec, "world": world, "params": n_params, "train": len(train_y) * world,
          "test": len(test_y) * world, "batch_per_rank": args.batch, "lr": args.lr, "schedule": args.schedule,
          "momentum": args.momentum, "max_steps": args.max_steps, "async_comm": args.async_comm,
          "seed": args.seed, "target": args.target, "res": args.res, "hidden": args.hidden, "depth": args.depth,
          "torch": torch.__version__})

    def evaluate():
        ddp.eval()
        with torch.no_grad():
            correct = sum(int((model(test_x[i:i + 512]).argmax(1) == test_y[i:i + 512]).sum())
                          for i in range(0, len(test_y), 512))
        ddp.train()
        return correct, len(test_y)

    dist.barrier()
    gen = torch.Generator().manual_seed(args.seed * 7919 + rank)
    step, epoch, train_s, loss_sum, loss_n = 0, 0, 0.0, 0.0, 0
    time_to_target, acc = None, 0.0
    order, pos = torch.randperm(len(train_y), generator=gen), 0
    t_start = time.perf_counter()
    t0 = t_start
    while True:
        if pos + args.batch > len(order):
            order, pos, epoch = torch.randperm(len(train_y), generator=gen), 0, epoch + 1
        idx = order[pos:pos + args.batch]
        pos += args.batch
        if args.schedule == "cosine":
            for group in opt.param_groups:
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.max_steps))
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(train_x[idx]), train_y[idx])
        loss.backward()
        opt.step()
        step += 1
        loss_sum += float(loss)
        loss_n += 1
        if step % args.eval_every and step < args.max_steps:
            continue
        train_s += time.perf_counter() - t0  # the clock stops for evaluation
        correct, total = evaluate()
        over = 1.0 if train_s >= args.max_time else 0.0
        sums = torch.tensor([correct, total, loss_sum, loss_n, over], dtype=torch.float64)
        dist.all_reduce(sums)
        acc = sums[0].item() / sums[1].item()
        if time_to_target is None and acc >= args.target:
            time_to_target = train_s
        rec = {"time": round(train_s, 4), "step": step, "epoch": epoch, "loss": sums[2].item() / sums[3].item(),
               "acc": acc, "elapsed": round(time.perf_counter() - t_start, 4)}
        if clock is not None:
            rec["comm_s"] = round(clock[0], 4)
            rec["bytes_sent"] = comm.stats()["bytes_sent"]
        emit(rec)
        loss_sum, loss_n = 0.0, 0
        if step >= args.max_steps or sums[4].item() > 0 or (args.stop_at_target and time_to_target is not None):
            break
        t0 = time.perf_counter()

    emit({"final": True, "codec": args.codec, "steps": step, "time": round(train_s, 4), "final_acc": acc,
          "target": args.target, "time_to_target": time_to_target,
          "comm_s": None if clock is None else round(clock[0], 4)})
    if rank == 0:
        print("codec %s: final accuracy %.2f%% after %d steps, %.1f s of training; time to %.1f%%: %s" % (
            args.codec, 100 * acc, step, train_s, 100 * args.target,
            "not reached" if time_to_target is None else "%.1f s" % time_to_target), file=sys.stderr)
    if log:
        log.close()
    if state is not None:
        state.close()
    dist.barrier()
    if comm is not None:
        comm.destroy()
    dist.destroy_process_group()


def _spawned(rank, world, port, args):
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    for name in ("CC_ROOT", "CC_RANK", "CC_NRANKS"):
        os.environ.pop(name, None)
    run(args)


def main():
    args = parse_args()
    if args.spawn:
        import random
        import torch.multiprocessing as mp
        mp.start_processes(_spawned, args=(args.spawn, random.randint(20000, 60000), args), nprocs=args.spawn,
                           start_method="fork")
    else:
        run(args)


if __name__ == "__main__":
    main()
