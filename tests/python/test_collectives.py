"""Collectives through the binding with ranks as processes (spawned; UCX between them), fresh random inputs each run.

Exact: every dtype and op against numpy's fp64 reference within the dtype's rounding, bitwise identical on every
rank. Compressed: vNMSE against the exact average within a loose bound that sending nothing (1.0) would fail,
fewer bytes on the wire than the exact all-reduce, bitwise identical on every rank. The ranks only compute and
return; every check runs here in the parent.
"""

import os
import socket
import time
import unittest

import numpy as np

import ranks
import ccoll

DTYPES = ["float32", "float64", "float16", "int32", "int64"]
COUNTS = [1, 7919, 65536 + 37]  # one element, a prime, more than one ring slice with a ragged tail


def _inputs(seed, rank, dtype, count, op):
    rng = np.random.default_rng([seed, rank, DTYPES.index(dtype), count, list(ccoll.OPS).index(op)])
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, count).astype(dtype)
    if op == "prod":
        return rng.uniform(0.5, 1.5, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def _exact_cases():
    cases = [(d, c, "sum") for d in DTYPES for c in COUNTS]
    cases += [(d, 7919, op) for d in ("float32", "float64", "int64") for op in ("avg", "max", "min", "prod")]
    cases += [("float16", 7919, "avg"), ("int32", 7919, "max")]
    return cases


def exact_rank(rank, nranks, uid, seed):
    out = {}
    with ranks.communicator(rank, nranks, uid) as comm:
        for dtype, count, op in _exact_cases():
            x = _inputs(seed, rank, dtype, count, op)
            y = x.copy()
            comm.all_reduce(y, op=op)  # in place
            z = np.empty_like(x)
            comm.all_reduce(x, op=op, out=z)  # out of place; x must not change
            out[(dtype, count, op)] = (x, y, z)
        try:
            comm.broadcast(np.zeros(5, np.float32), root=nranks)
            error = None
        except ccoll.CcollError as e:
            error = (type(e).__name__, str(e))
    return out, error


WRAPPING = ["int8", "uint8", "uint32", "uint64"]


def wrapping_rank(rank, nranks, uid, seed):
    """Any bits of the 8-bit and unsigned integer types, every op: sums and products wrap."""
    out = {}
    with ranks.communicator(rank, nranks, uid) as comm:
        for dtype in WRAPPING:
            info = np.iinfo(dtype)
            x = np.random.default_rng([seed, rank, WRAPPING.index(dtype)]).integers(
                info.min, info.max, 1001, dtype=dtype, endpoint=True)
            for op in ccoll.OPS:
                out[(dtype, op)] = (x, comm.all_reduce(x.copy(), op=op))
    return out


def others_rank(rank, nranks, uid, seed):
    rng = np.random.default_rng([seed, rank])
    with ranks.communicator(rank, nranks, uid, algorithm="ring") as comm:
        x = rng.standard_normal((nranks, 1001)).astype(np.float32)
        rs = comm.reduce_scatter(x)
        g = rng.integers(-2**40, 2**40, (3, 5)).astype(np.int64)
        ag = comm.all_gather(g)
        b = rng.standard_normal(4099)
        root = nranks - 1
        bc = comm.broadcast(b.copy(), root=root)
        d = rng.standard_normal(2049)
        kept = d.copy()
        rd = comm.reduce(d, root=1, op="avg")  # in place on root 1; the others' d is only read
        # Out of place: off root the library ignores recvbuff, and so does the binding (even one of another size).
        out = np.empty(2049) if rank == 1 else np.empty(3)
        rd2 = comm.reduce(kept.copy(), root=1, op="avg", out=out)
        return x, rs, g, ag, b, bc, d, rd, kept, rd2


def _rounding_bound(dtype, inputs, nranks):
    """|result - fp64 sum| allowed: a rounding of each of the nranks - 1 partial sums and of the result, each at most
    eps * (sum of |inputs|)."""
    eps = float(np.finfo(dtype).eps) if np.dtype(dtype).kind == "f" else 0.0
    return nranks * eps * np.sum(np.abs(np.stack(inputs).astype(np.float64)), axis=0)


class TestExact(unittest.TestCase):
    def check_exact(self, nranks):
        seed = np.random.SeedSequence().entropy % 2**32
        results = ranks.run(nranks, exact_rank, seed)
        for key in _exact_cases():
            dtype, count, op = key
            with self.subTest(nranks=nranks, dtype=dtype, count=count, op=op, seed=seed):
                inputs = [_inputs(seed, r, dtype, count, op) for r in range(nranks)]
                for r in range(nranks):
                    x, y, z = results[r][0][key]
                    np.testing.assert_array_equal(x, inputs[r], "the out-of-place input changed")
                    self.assertEqual(y.tobytes(), z.tobytes(), "in place and out of place differ on rank %d" % r)
                    self.assertEqual(y.tobytes(), results[0][0][key][1].tobytes(),
                                     "rank %d differs from rank 0 (results must be bitwise identical)" % r)
                got = results[0][0][key][1].astype(np.float64)
                stack = np.stack(inputs).astype(np.float64)
                if op in ("max", "min"):
                    np.testing.assert_array_equal(got, getattr(stack, op)(axis=0))
                    continue
                if op == "prod" and dtype.startswith("int"):
                    np.testing.assert_array_equal(results[0][0][key][1], np.prod(np.stack(inputs), axis=0))
                    continue
                if op == "prod":
                    ref = np.prod(stack, axis=0)
                    np.testing.assert_allclose(got, ref, rtol=2 * nranks * np.finfo(dtype).eps, atol=0)
                    continue
                ref = stack.sum(axis=0)
                bound = _rounding_bound(dtype, inputs, nranks)
                if op == "avg":
                    if dtype.startswith("int"):
                        ref = np.trunc(ref / nranks)  # integer division, as NCCL
                    else:
                        ref, bound = ref / nranks, bound / nranks + np.finfo(dtype).eps * np.abs(ref / nranks)
                err = np.abs(got - ref)
                worst = int(np.argmax(err - bound))
                self.assertTrue(np.all(err <= bound), "element %d: %r vs fp64 reference %r (bound %g)" % (
                    worst, got[worst], ref[worst], bound[worst]))
        name, message = results[0][1]
        self.assertEqual(name, "InvalidArgumentError")
        self.assertIn("ccBroadcast: root %d is out of range for %d ranks (rank 0)" % (nranks, nranks), message)
        self.assertIn("(rank %d)" % (nranks - 1), results[nranks - 1][1][1])

    def test_exact_3_ranks(self):
        self.check_exact(3)

    def test_exact_4_ranks(self):
        self.check_exact(4)

    def test_wrapping_integers(self):
        nranks = 3
        seed = np.random.SeedSequence().entropy % 2**32
        results = ranks.run(nranks, wrapping_rank, seed)
        for (dtype, op), (_, got) in results[0].items():
            with self.subTest(dtype=dtype, op=op, seed=seed):
                stack = np.stack([results[r][(dtype, op)][0] for r in range(nranks)])
                if op in ("max", "min"):
                    want = getattr(stack, op)(axis=0)
                elif op == "prod":
                    want = np.prod(stack, axis=0, dtype=dtype)  # numpy's integer products wrap too
                else:
                    want = np.sum(stack, axis=0, dtype=dtype)
                    if op == "avg":  # the wrapped sum divided by nranks, toward zero
                        want = (np.sign(want) * (np.abs(want.astype(object)) // nranks)).astype(dtype)
                self.assertEqual(got.dtype, np.dtype(dtype))
                np.testing.assert_array_equal(got, want)
                for r in range(1, nranks):
                    self.assertEqual(results[r][(dtype, op)][1].tobytes(), got.tobytes())

    def test_reduce_scatter_all_gather_broadcast(self):
        nranks = 3
        seed = np.random.SeedSequence().entropy % 2**32
        results = ranks.run(nranks, others_rank, seed)
        xs = np.stack([res[0] for res in results]).astype(np.float64)
        ds = np.stack([res[8] for res in results])
        for r, (x, rs, g, ag, b, bc, d, rd, kept, rd2) in enumerate(results):
            self.assertEqual(rs.shape, (1001,))
            ref = xs[:, r].sum(axis=0)
            self.assertTrue(np.all(np.abs(rs - ref) <= _rounding_bound("float32", list(xs[:, r]), nranks)))
            self.assertEqual(ag.shape, (nranks, 3, 5))
            for q in range(nranks):
                np.testing.assert_array_equal(ag[q], results[q][2])
            self.assertEqual(bc.tobytes(), results[nranks - 1][4].tobytes())
            if r == 1:
                np.testing.assert_allclose(rd, ds.mean(axis=0), rtol=0, atol=1e-14 * np.abs(ds).sum(axis=0).max())
                self.assertIs(rd, d)
                self.assertEqual(rd2.tobytes(), rd.tobytes())
            else:
                self.assertIsNone(rd)
                self.assertIsNone(rd2)
                self.assertEqual(d.tobytes(), kept.tobytes())


def _p2p_bytes(seed, frm, to, k, count, dtype):
    rng = np.random.default_rng([seed, frm, to, k])
    return rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)


def p2p_rank(rank, nranks, uid, seed):
    nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
    with ccoll.Communicator(nranks, uid, rank, timeout_ms=ranks.RANK_TIMEOUT_MS) as comm:
        out = {}
        # A ring exchange in a group, two dtypes and a size past one ring slice.
        for dtype, count in (("float32", 70001), ("int8", 5)):
            y = np.zeros(count, dtype)
            with ccoll.group():
                got = comm.recv(y, peer=prv)
                comm.send(_p2p_bytes(seed, rank, nxt, 0, count, dtype), peer=nxt)
            out[("ring", dtype)] = (got is y, y)
        # An all-to-all with the send to itself, in one group.
        ys = [np.zeros(100 + 10 * p + rank, "float64") for p in range(nranks)]
        with ccoll.group():
            for p in range(nranks):
                comm.send(_p2p_bytes(seed, rank, p, 1, 100 + 10 * rank + p, "float64"), peer=p)
                comm.recv(ys[p], peer=p)
        out["all-to-all"] = ys
        # An exception inside a group issues none of its calls; a bad peer raises before anything moves.
        try:
            with ccoll.group():
                comm.send(_p2p_bytes(seed, rank, nxt, 2, 8, "int32"), peer=nxt)
                raise ValueError("left the group")
        except ValueError:
            pass
        try:
            comm.send(np.zeros(4, "int32"), peer=nranks)
            out["bad peer"] = None
        except ccoll.InvalidArgumentError as e:
            out["bad peer"] = str(e)
        # A send the binding refuses (a non-contiguous array) inside a group: the group issues nothing either.
        try:
            with ccoll.group():
                comm.send(_p2p_bytes(seed, rank, nxt, 2, 8, "int32"), peer=nxt)
                try:
                    comm.send(np.zeros((4, 4), "int32")[:, 0], peer=nxt)
                except ccoll.InvalidArgumentError:
                    pass
            out["binding refusal"] = None
        except ccoll.CcollError as e:
            out["binding refusal"] = str(e)
        # Collectives in a group on temporaries: the binding holds them until the group ends.
        with ccoll.group():
            gathered = comm.all_gather(np.full(4, rank, np.int32))
            summed = comm.all_reduce(np.full(3, float(rank + 1)))
        out["gathered"], out["summed"] = gathered, summed
        # Blocking, outside a group: rank 0 sends to rank 1 (the first message between them since the ring).
        if rank == 0:
            comm.send(_p2p_bytes(seed, 0, 1, 3, 8, "int32"), peer=1)
        elif rank == 1:
            out["ordered"] = comm.recv(np.zeros(8, "int32"), peer=0)
        return out


def _a2a_block(seed, frm, to, k, count, dtype):
    """The block rank `frm` sends to rank `to` in all-to-all number k."""
    return _p2p_bytes(seed, frm, to, 10 + k, count, dtype)


def all_to_all_rank(rank, nranks, uid, seed):
    with ccoll.Communicator(nranks, uid, rank, timeout_ms=ranks.RANK_TIMEOUT_MS) as comm:
        out = {}
        # A new output of x's shape; then a given one, 1-D; then empty blocks.
        x = np.stack([_a2a_block(seed, rank, p, 0, 1000, "float32") for p in range(nranks)])
        out["new"] = comm.all_to_all(x)
        x = np.concatenate([_a2a_block(seed, rank, p, 1, 7, "int64") for p in range(nranks)])
        y = np.zeros_like(x)
        out["given"] = (comm.all_to_all(x, out=y) is y, y)
        out["empty"] = comm.all_to_all(np.zeros(0, np.float64)).shape
        # Refused by the binding on every rank, before anything moved: blocks of unequal size, out overlapping x.
        errors = []
        for bad in (lambda: comm.all_to_all(np.zeros(nranks + 1, np.int32)),
                    lambda: comm.all_to_all(x, out=x),
                    lambda: comm.all_to_all(x, out=np.zeros(len(x), np.int32))):
            try:
                bad()
                errors.append(None)
            except ccoll.InvalidArgumentError as e:
                errors.append(str(e))
        out["errors"] = errors
        # Inside an open group, with a collective: both issued when the group ends.
        x = np.stack([_a2a_block(seed, rank, p, 2, 3, "int8") for p in range(nranks)])
        with ccoll.group():
            grouped = comm.all_to_all(x)
            summed = comm.all_reduce(np.full(2, rank + 1, np.int32))
        out["grouped"], out["summed"] = grouped, summed
        return out


class TestPointToPoint(unittest.TestCase):
    def test_all_to_all(self):
        nranks = 3
        seed = np.random.SeedSequence().entropy % 2**32
        results = ranks.run(nranks, all_to_all_rank, seed)
        for r, out in enumerate(results):
            with self.subTest(rank=r, seed=seed):
                self.assertEqual(out["new"].shape, (nranks, 1000))
                same, given = out["given"]
                self.assertTrue(same, "all_to_all returns the out it was given")
                for p in range(nranks):
                    self.assertEqual(out["new"][p].tobytes(), _a2a_block(seed, p, r, 0, 1000, "float32").tobytes())
                    self.assertEqual(given[7 * p:7 * (p + 1)].tobytes(), _a2a_block(seed, p, r, 1, 7, "int64").tobytes())
                    self.assertEqual(out["grouped"][p].tobytes(), _a2a_block(seed, p, r, 2, 3, "int8").tobytes())
                self.assertEqual(out["empty"], (0,))
                unequal, overlap, dtype = out["errors"]
                self.assertIn("%d elements do not split into %d equal blocks" % (nranks + 1, nranks), unequal)
                self.assertIn("out overlaps x", overlap)
                self.assertIn("dtype int32 differs from the input's int64", dtype)
                np.testing.assert_array_equal(out["summed"], np.full(2, nranks * (nranks + 1) // 2))

    def test_send_recv_and_groups(self):
        nranks = 3
        seed = np.random.SeedSequence().entropy % 2**32
        results = ranks.run(nranks, p2p_rank, seed)
        for r, out in enumerate(results):
            with self.subTest(rank=r, seed=seed):
                prv = (r - 1) % nranks
                for dtype, count in (("float32", 70001), ("int8", 5)):
                    same, y = out[("ring", dtype)]
                    self.assertTrue(same, "recv returns the buffer it received into")
                    self.assertEqual(y.tobytes(), _p2p_bytes(seed, prv, r, 0, count, dtype).tobytes())
                for p in range(nranks):
                    self.assertEqual(out["all-to-all"][p].tobytes(),
                                     _p2p_bytes(seed, p, r, 1, 100 + 10 * p + r, "float64").tobytes())
                self.assertIn("ccSend: peer 3 is out of range for 3 ranks", out["bad peer"])
                self.assertIn("none was issued", out["binding refusal"])
                np.testing.assert_array_equal(out["gathered"], np.repeat(np.arange(nranks), 4).reshape(nranks, 4))
                np.testing.assert_array_equal(out["summed"], np.full(3, nranks * (nranks + 1) / 2))
                if r == 1:  # message 3, not the discarded message 2
                    self.assertEqual(out["ordered"].tobytes(), _p2p_bytes(seed, 0, 1, 3, 8, "int32").tobytes())


def from_env_rank(rank, nranks, uid, root):
    # Before any ccoll call in this process: the library reads its environment once.
    os.environ.update({"CC_RANK": str(rank), "CC_NRANKS": str(nranks), "CC_ROOT": root, "CC_SECRET": "py-test"})
    with ccoll.Communicator.from_env(timeout_ms=ranks.RANK_TIMEOUT_MS) as comm:
        return comm.rank, comm.size, comm.all_reduce(np.array([rank + 1], np.int64))[0]


class TestFromEnv(unittest.TestCase):
    def test_from_env(self):
        with socket.socket() as s:  # a free port for rank 0's listener
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        results = ranks.run(3, from_env_rank, "127.0.0.1:%d" % port)
        self.assertEqual(results, [(r, 3, 6) for r in range(3)])


def split_rank(rank, nranks, uid, seed):
    """Rank nranks-1 takes no part; the others split by parity, keys reversed. Returns the new rank and size, the
    group's sum of float64 inputs, a bad color's error on every rank, and a sum on the parent after."""
    x = np.random.default_rng([seed, rank]).standard_normal(1000)
    with ranks.communicator(rank, nranks, uid) as comm:
        sub = comm.split(None if rank == nranks - 1 else rank % 2, key=-rank)
        place, total = None, None
        if sub is not None:
            with sub:
                place = (sub.rank, sub.size)
                total = sub.all_reduce(x.copy())
        errors = []
        for bad in (-5, "x"):  # refused by the library, then by the binding before the call
            start = time.monotonic()
            try:
                comm.split(bad if rank == 0 else 0)
                errors.append(None)
            except ccoll.CcollError as e:
                errors.append((type(e).__name__, str(e), time.monotonic() - start))
        return x, place, total, errors, comm.all_reduce(x.copy())


class TestSplit(unittest.TestCase):
    def test_split(self):
        nranks = 5
        seed = np.random.SeedSequence().entropy % 2**32
        results = ranks.run(nranks, split_rank, seed)
        xs = [res[0] for res in results]
        for r, (x, place, total, errors, parent_sum) in enumerate(results):
            if r == nranks - 1:
                self.assertIsNone(place)
            else:
                members = sorted((q for q in range(nranks - 1) if q % 2 == r % 2), reverse=True)
                self.assertEqual(place, (members.index(r), len(members)))
                ref = np.sum([xs[q] for q in members], axis=0)
                np.testing.assert_allclose(total, ref, rtol=0, atol=1e-12 * len(members) * np.abs(ref).max())
                for q in members:
                    self.assertEqual(results[q][2].tobytes(), total.tobytes())
            for error, own in zip(errors, ("color -5", "color must be an integer")):
                self.assertEqual(error[0], "InvalidArgumentError")
                self.assertIn(own if r == 0 else "rank 0 of the parent communicator passed", error[1])
                self.assertLess(error[2], 5.0, "not the timeout: every rank fails at once")
            self.assertEqual(parent_sum.tobytes(), results[0][4].tobytes())


def refused_rank(rank, nranks, uid):
    """Rank 1's arguments fail the binding's own checks (an op name, then a read-only buffer the root must write):
    every rank must fail at once, and the communicator must stay usable."""
    out = []
    with ranks.communicator(rank, nranks, uid) as comm:
        x = np.ones(1000, np.float32)
        readonly = np.ones(1000, np.float32)
        readonly.setflags(write=False)
        for call in (lambda: comm.all_reduce(x.copy(), op="bogus" if rank == 1 else "sum"),
                     lambda: comm.reduce(readonly if rank == 1 else x.copy(), root=1)):
            start = time.monotonic()
            try:
                call()
                out.append(None)
            except ccoll.CcollError as e:
                out.append((type(e).__name__, str(e), time.monotonic() - start))
        out.append(comm.all_reduce(x.copy())[0])
    return out


class TestRefusedInTheBinding(unittest.TestCase):
    def test_every_rank_fails_at_once(self):
        nranks = 3
        results = ranks.run(nranks, refused_rank)
        for r, (bad_op, bad_buffer, after) in enumerate(results):
            for error, own in ((bad_op, "op \"bogus\""), (bad_buffer, "read-only")):
                self.assertIsNotNone(error, "rank %d" % r)
                self.assertLess(error[2], 5.0, "rank %d waited for the timeout" % r)
                if r == 1:
                    self.assertEqual(error[0], "InvalidArgumentError")
                    self.assertIn(own, error[1])
                else:
                    self.assertEqual(error[0], "InvalidUsageError")
                    self.assertIn("rank 1 refused the call", error[1])
            self.assertEqual(after, nranks)


# Correlated gradients, as the C tests use: rank r holds g + 0.5 * noise_r with g shared.
def _corr_input(seed, rank, count):
    g = np.random.default_rng([seed, 1 << 20]).standard_normal(count)
    return (g + 0.5 * np.random.default_rng([seed, rank]).standard_normal(count)).astype(np.float32)


# Top-k friendly: 10% of the 1024-element chunks are hot (|values| ~ 10), the rest near zero.
def _sparse_input(seed, rank, count):
    hot = np.random.default_rng([seed, 1 << 21]).permutation(count // 1024)[: count // 10240]
    x = 0.01 * np.random.default_rng([seed, rank]).standard_normal(count)
    for c in hot:
        x[c * 1024:(c + 1) * 1024] += 10.0 * np.random.default_rng([seed, rank, c]).standard_normal(1024)
    return x.astype(np.float32)


# spec, input, vNMSE bound, max wire bytes as a fraction of the exact float32 all-reduce's.
COMPRESSED_CASES = [
    ("quant:bits=4,mode=requant", _corr_input, 0.06, 0.2),  # measured ~0.03, 4.5 bits per element
    ("quant:bits=8,mode=homomorphic", _corr_input, 2e-4, 0.4),  # ~4e-5, 10 bits
    ("cast16", _corr_input, 2e-5, 0.55),  # ~5e-6, 16 bits
    ("topk:density=0.1,chunk=1024", _sparse_input, 1e-4, 0.2),  # ~1e-5: what is not sent is near zero
]
COMPRESSED_COUNT = 1 << 17


def compressed_rank(rank, nranks, uid, seed):
    out = {}
    with ranks.communicator(rank, nranks, uid) as comm:
        for spec, make, _, _ in COMPRESSED_CASES:
            x = make(seed, rank, COMPRESSED_COUNT)
            before = comm.stats()["bytes_sent"]
            exact = comm.all_reduce(x.copy(), op="avg")
            exact_bytes = comm.stats()["bytes_sent"] - before
            with ccoll.Compressor(spec) as comp:
                before = comm.stats()["bytes_sent"]
                y = comm.all_reduce(x.copy(), op="avg", compressor=comp)
                wire_bytes = comm.stats()["bytes_sent"] - before
                # A second call on the same bucket (topk: with the first call's error feedback added).
                y2 = comm.all_reduce(x.copy(), op="avg", compressor=comp)
            out[spec] = (exact, y, y2, wire_bytes / exact_bytes)
    return out


def vnmse(got, ref):
    ref = ref.astype(np.float64)
    return float(np.sum((got.astype(np.float64) - ref) ** 2) / np.sum(ref ** 2))


class TestCompressed(unittest.TestCase):
    def test_compressed_4_ranks(self):
        nranks = 4
        seed = np.random.SeedSequence().entropy % 2**32
        results = ranks.run(nranks, compressed_rank, seed)
        for spec, make, bound, max_wire in COMPRESSED_CASES:
            with self.subTest(spec=spec, seed=seed):
                m = np.mean([make(seed, r, COMPRESSED_COUNT).astype(np.float64) for r in range(nranks)], axis=0)
                exact, y, y2, wire = results[0][spec]
                for r in range(1, nranks):
                    for i, name in ((1, "first call"), (2, "second call")):
                        self.assertEqual(results[r][spec][i].tobytes(), results[0][spec][i].tobytes(),
                                         "%s: rank %d differs from rank 0" % (name, r))
                self.assertLess(vnmse(exact, m), 1e-12)
                e1, e2 = vnmse(y, m), vnmse(y2, m)
                self.assertTrue(np.all(np.isfinite(y)) and np.all(np.isfinite(y2)))
                self.assertLessEqual(e1, bound, "vNMSE of the first call")
                self.assertLessEqual(e2, 2 * bound, "vNMSE of the second call")
                self.assertGreater(e1, 0.0, "lossy codec returned the exact result: was it applied?")
                self.assertLessEqual(wire, max_wire, "wire bytes / exact float32 bytes")
                if spec.startswith("topk"):
                    # Every hot chunk is sent; on the first call at most density of the chunks are (the rest of
                    # the result is exactly zero).
                    sent = np.abs(y.reshape(-1, 1024)).max(axis=1) > 0
                    hot = np.abs(m.reshape(-1, 1024)).max(axis=1) > 1.0
                    self.assertEqual(int(np.count_nonzero(hot)), COMPRESSED_COUNT // 10240)
                    self.assertTrue(np.all(sent[hot]), "a hot chunk was not sent")
                    self.assertLessEqual(int(np.count_nonzero(sent)), int(np.ceil(0.1 * len(sent))))


if __name__ == "__main__":
    unittest.main()
