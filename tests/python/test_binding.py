"""The binding in one process: ids, configs, compressors, errors (with the library's sentences), buffer checks, and
ranks as threads (which only works if every ccoll call releases the GIL)."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

import ranks  # noqa: F401 -- sets up the library and import paths
import ccoll


def single_rank(**kwargs):
    return ccoll.Communicator(1, ccoll.get_unique_id(), 0, **kwargs)


class TestLibrary(unittest.TestCase):
    def test_version_and_id(self):
        self.assertGreaterEqual(ccoll.version(), 100)  # CC_VERSION(0, 1, 0)
        a, b = ccoll.get_unique_id(), ccoll.get_unique_id()
        self.assertIsInstance(a, bytes)
        self.assertEqual(len(a), 128)
        self.assertNotEqual(a, b)  # a random secret per group

    def test_single_rank_communicator(self):
        for kwargs in ({}, {"timeout_ms": 5000, "algorithm": "tree", "transport": "auto"}, {"algorithm": "ring"}):
            with single_rank(**kwargs) as comm:
                self.assertEqual((comm.rank, comm.size), (0, 1))
                if not os.path.exists("/dev/nvidiactl"):  # no GPU driver: host buffers only
                    self.assertIsNone(comm.cuda_device)
                x = np.arange(11, dtype=np.float64)
                self.assertIs(comm.all_reduce(x), x)
                np.testing.assert_array_equal(x, np.arange(11))
                out = np.empty(11)
                self.assertIs(comm.all_reduce(x, op="max", out=out), out)
                np.testing.assert_array_equal(out, x)
                self.assertEqual(comm.all_gather(x).shape, (1, 11))
                self.assertEqual(comm.stats()["collectives"], 3)
                self.assertEqual(comm.async_error(), 0)

    def test_destroyed_communicator_raises(self):
        comm = single_rank()
        comm.destroy()
        comm.destroy()  # idempotent
        with self.assertRaises(ccoll.InvalidArgumentError):
            comm.all_reduce(np.zeros(3, np.float32))
        comm = single_rank()
        comm.abort()
        with self.assertRaises(ccoll.CcollError):
            comm.stats()

    def test_with_block_aborts_on_exception(self):
        with self.assertRaises(KeyError):
            with single_rank() as comm:
                raise KeyError("x")
        self.assertIsNone(comm._handle)

    def test_init_is_blocking_whatever_CC_BLOCKING_says(self):
        # The library reads its environment once per process: CC_BLOCKING=0 goes to a fresh one.
        with socket.socket() as s:  # a free port for from_env's listener
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        code = "\n".join([
            "import numpy as np, ccoll",
            "for make in (lambda: ccoll.Communicator(1, ccoll.get_unique_id(), 0),",
            "             lambda: ccoll.Communicator(1, ccoll.get_unique_id(), 0, timeout_ms=5000),",
            "             lambda: ccoll.Communicator.from_env(),",
            "             lambda: ccoll.Communicator.from_env(timeout_ms=5000, algorithm='ring')):",
            "    with make() as comm:",
            "        print(comm.size, comm.async_error(), comm.all_reduce(np.full(2, 3, np.int32)).sum())",
        ])
        env = dict(os.environ, CC_BLOCKING="0", CC_RANK="0", CC_NRANKS="1", CC_ROOT="127.0.0.1:%d" % port)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split("\n"), ["1 0 6"] * 4 + [""])


class TestInstalledLayout(unittest.TestCase):
    def test_package_finds_the_library_next_to_it(self):
        # What `cmake --install` makes: <prefix>/lib/libccoll.so.0 and <prefix>/lib/python3/dist-packages/ccoll
        # with _install.py naming the library directory relative to the package.
        with tempfile.TemporaryDirectory() as prefix:
            libdir = os.path.join(prefix, "lib")
            pkg = os.path.join(libdir, "python3", "dist-packages", "ccoll")
            shutil.copytree(os.path.dirname(ccoll.__file__), pkg, ignore=shutil.ignore_patterns("__pycache__"))
            with open(os.path.join(pkg, "_install.py"), "w") as f:
                f.write('LIBDIR = "../../../"\n')
            os.symlink(os.path.realpath(ccoll.library_path), os.path.join(libdir, "libccoll.so.0"))
            env = {k: v for k, v in os.environ.items() if k not in ("CCOLL_LIBRARY", "PYTHONPATH")}
            env["PYTHONPATH"] = os.path.dirname(pkg)
            code = "import ccoll; print(ccoll.library_path); print(ccoll.version())"
            out = subprocess.run([sys.executable, "-c", code], env=env, cwd=prefix, capture_output=True, text=True,
                                 timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            path, version = out.stdout.split()
            self.assertEqual(path, os.path.join(libdir, "libccoll.so.0"))
            self.assertEqual(int(version), ccoll.version())

    def test_bad_ccoll_library_is_an_import_error(self):
        env = dict(os.environ, CCOLL_LIBRARY="/nonexistent/libccoll.so")
        out = subprocess.run([sys.executable, "-c", "import ccoll"], env=env, capture_output=True, text=True,
                             timeout=60)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("cannot load libccoll.so", out.stderr)
        self.assertIn("/nonexistent/libccoll.so", out.stderr)


class TestErrors(unittest.TestCase):
    def assertRaisesSentence(self, cls, *fragments):
        """Context: the block must raise cls whose message holds every fragment (the C library's sentence)."""
        test = self

        class Ctx:
            def __enter__(self):
                return self

            def __exit__(self, exc_type, exc, tb):
                test.assertIsNotNone(exc_type, "no exception raised; expected %s" % cls.__name__)
                test.assertTrue(issubclass(exc_type, cls), "raised %s: %s" % (exc_type.__name__, exc))
                for f in fragments:
                    test.assertIn(f, str(exc))
                self.exception = exc
                return True

        return Ctx()

    def test_bad_spec_raises_the_library_sentence(self):
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "ccCompressorCreateFromString",
                                       '"quant:bitz=4"', 'quant has no parameter "bitz"') as ctx:
            ccoll.Compressor("quant:bitz=4")
        self.assertEqual(ctx.exception.result, 4)  # ccInvalidArgument
        self.assertEqual(ctx.exception.result_string.split(" (")[0], "invalid argument")
        with self.assertRaisesSentence(ccoll.CcollError, 'unknown compressor kind "zip"'):
            ccoll.Compressor("zip:level=3")
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, '"bits" is not name=value'):
            ccoll.Compressor("quant:bits")

    def test_wrong_count_raises_the_library_sentence(self):
        with single_rank() as comm, ccoll.Compressor("quant:bits=4,mode=requant") as comp:
            comm.all_reduce(np.ones(4096, np.float32), compressor=comp)
            with self.assertRaisesSentence(ccoll.InvalidUsageError, "ccAllReduce",
                                           "bound to a bucket of 4096 elements but count is 4095", "rank 0"):
                comm.all_reduce(np.ones(4095, np.float32), compressor=comp)
            with self.assertRaisesSentence(ccoll.InvalidUsageError,
                                           "compressed all-reduce takes float32, bfloat16 or float16 data"):
                comm.all_reduce(np.ones(4096, np.float64), compressor=comp)
            with self.assertRaisesSentence(ccoll.InvalidUsageError, "takes op sum or avg, not max"):
                comm.all_reduce(np.ones(4096, np.float32), op="max", compressor=comp)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "root 1 is out of range for 1 ranks"):
                comm.broadcast(np.ones(3, np.int32), root=1)

    def test_compressor_argument_must_be_a_compressor(self):
        with single_rank() as comm:
            with self.assertRaisesSentence(ccoll.InvalidArgumentError,
                                           "all_reduce: compressor must be a ccoll.Compressor or None, not str"):
                comm.all_reduce(np.ones(8, np.float32), compressor="quant:bits=4")

    def test_compressor_destroyed_inside_a_group_is_freed_when_it_ends(self):
        # The group's recorded all-reduce reads the compressor at the group's end: destroy() must not free it before
        # (it did: the call then failed, or used another compressor made at the same address meanwhile).
        with single_rank() as comm:
            x = np.linspace(-1.0, 1.0, 4096).astype(np.float32)
            want = x.copy()
            with ccoll.group():
                comp = ccoll.Compressor("quant:bits=4,mode=requant")
                comm.all_reduce(x, compressor=comp)
                comp.destroy()
                with self.assertRaisesSentence(ccoll.InvalidArgumentError, "the compressor was destroyed"):
                    comp.get_param("bits")
                other = ccoll.Compressor("quant:bits=8")  # may take the freed address if it were freed
            np.testing.assert_array_equal(x, want)  # one rank: the compressed all-reduce is a copy
            self.assertEqual(other.get_param("bits"), 8)
            comm.all_reduce(np.ones(1000, np.float32), compressor=other)  # other is its own, unbound
            other.destroy()

    def test_cuda_device_reaches_the_config(self):
        from ccoll import communicator
        from ccoll._library import CC_CONFIG_UNDEF_INT
        config = communicator._config(None, None, None)
        self.assertEqual(config.blocking, 1)
        self.assertEqual((config.cudaDev, config.timeoutMs, config.algorithm, config.transport),
                         (CC_CONFIG_UNDEF_INT,) * 4)
        self.assertEqual(communicator._config(None, None, None, 3).cudaDev, 3)
        self.assertEqual(communicator._config(None, None, None, np.int64(2)).cudaDev, 2)
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            self.assertEqual(communicator._config(None, None, None, torch.device("cuda:2")).cudaDev, 2)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "cuda_device device(type='cpu')"):
                communicator._config(None, None, None, torch.device("cpu"))
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "cuda_device 'cuda'"):
            communicator._config(None, None, None, "cuda")
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "ccConfig_t.cudaDev -1 is negative"):
            single_rank(cuda_device=-1)
        with single_rank(cuda_device=0) as comm:  # host buffers take no device
            x = np.arange(5, dtype=np.float32)
            comm.all_reduce(x)
            np.testing.assert_array_equal(x, np.arange(5))

    def test_init_errors(self):
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "nranks 0 is out of range"):
            ccoll.Communicator(0, ccoll.get_unique_id(), 0)
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "rank 2 is out of range for nranks 2"):
            ccoll.Communicator(2, ccoll.get_unique_id(), 2)
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "unique_id has 5 bytes"):
            ccoll.Communicator(1, b"12345", 0)
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, 'algorithm "fast"'):
            single_rank(algorithm="fast")

    def test_python_side_buffer_checks(self):
        with single_rank() as comm:
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "not C-contiguous"):
                comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1])
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "numpy dtype int16"):
                comm.all_reduce(np.zeros(4, np.int16))
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "read-only"):
                x = np.zeros(4, np.float32)
                x.setflags(write=False)
                comm.all_reduce(x)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "dtype float64 differs"):
                comm.all_reduce(np.zeros(4, np.float32), out=np.zeros(4, np.float64))
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "out has 5 elements; 4 expected"):
                comm.all_reduce(np.zeros(4, np.float32), out=np.zeros(5, np.float32))
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "expected a numpy.ndarray or a torch.Tensor"):
                comm.all_reduce([1.0, 2.0])
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, 'op "mean"'):
                comm.all_reduce(np.zeros(4, np.float32), op="mean")

    def test_integers_are_checked_before_they_reach_c(self):
        # ctypes would keep the low 32 or 64 bits (2**32 + 4 is op 4, avg), int() would truncate 0.5 to 0.
        out_of_int = "out of range (-2147483648 .. 2147483647)"
        with single_rank() as comm:
            x = np.ones(4, np.float32)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "op 4294967300 is " + out_of_int):
                comm.all_reduce(x, op=2**32 + 4)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "op 4294967300 is " + out_of_int):
                comm.reduce_scatter(x, op=2**32 + 4)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "op must be an integer, not the bool True"):
                comm.all_reduce(x, op=True)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "root 4294967296 is " + out_of_int):
                comm.broadcast(x, root=2**32)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "root must be an integer, not 0.5"):
                comm.broadcast(x, root=0.5)
            np.testing.assert_array_equal(comm.all_reduce(x, op=np.int32(4)), np.ones(4))  # numpy ints are ints
            np.testing.assert_array_equal(comm.broadcast(x, root=0.0), np.ones(4))  # so are integral floats
        uid = ccoll.get_unique_id()
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "rank 4294967296 is " + out_of_int):
            ccoll.Communicator(1, uid, 2**32)
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "nranks 4294967297 is " + out_of_int):
            ccoll.Communicator(2**32 + 1, uid, 0)
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "rank must be an integer, not str '0'"):
            ccoll.Communicator(1, uid, "0")
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "timeout_ms 4294967301 is out of range"):
            single_rank(timeout_ms=2**32 + 5)
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "timeout_ms -2147483648 is out of range"):
            single_rank(timeout_ms=-2**31)  # CC_CONFIG_UNDEF_INT: it would mean "not set"
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "timeout_ms must be an integer, not 0.5"):
            single_rank(timeout_ms=0.5)
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "algorithm 4294967297 is out of range"):
            single_rank(algorithm=2**32 + 1)
        with self.assertRaisesSentence(ccoll.InvalidArgumentError, "cuda_device must be an integer, not the bool"):
            single_rank(cuda_device=True)
        with single_rank(timeout_ms=5000.0, algorithm=np.int64(1)) as comm:
            self.assertEqual(comm.size, 1)
        out_of_int64 = "out of range (-9223372036854775808 .. 9223372036854775807)"
        with ccoll.Compressor("quant:bits=4") as comp:
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "value of bits 18446744073709551620 is " +
                                           out_of_int64):
                comp.set_param("bits", 2**64 + 4)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "value of bits must be an integer, not 4.9"):
                comp.set_param("bits", 4.9)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "value of ef must be an integer, not the bool"):
                comp.set_param("ef", True)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "compressor parameter 4294967396 is " +
                                           out_of_int):
                comp.set_param(2**32 + 100, 3)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "compressor parameter 4294967396 is"):
                comp.get_param(2**32 + 100)
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "compressor parameter 4294967396 is"):
                ccoll.param_bounds(2**32 + 100)
            self.assertEqual(comp.get_param("bits"), 4)  # nothing above reached the compressor
            comp.set_param("bits", 6.0)
            self.assertEqual(comp.get_param("bits"), 6)


class TestCompressor(unittest.TestCase):
    def _powersgd(self, spec):
        """Compressor(spec), or skips the test in a build without BLAS (it has no PowerSGD)."""
        try:
            return ccoll.Compressor(spec)
        except ccoll.InvalidUsageError as e:
            self.skipTest(str(e))

    def test_spec_and_params(self):
        with ccoll.Compressor("quant:bits=4,mode=requant") as comp:
            spec = comp.spec
            self.assertTrue(spec.startswith("quant:"), spec)
            self.assertIn("bits=4", spec)
            self.assertIn("mode=requant", spec)
            self.assertEqual(ccoll.Compressor(spec).spec, spec)  # canonical form round-trips
            self.assertEqual(comp.get_param("bits"), 4)
            self.assertEqual(comp.get_param(ccoll.Param.MODE), ccoll.QUANT_REQUANT)
            comp.set_param("bits", 8)
            comp.set_param(ccoll.Param.MODE, ccoll.QUANT_HOMOMORPHIC)
            self.assertEqual(comp.get_param(100), 8)
            self.assertIn("bits=8", comp.spec)
            self.assertIn("mode=homomorphic", comp.spec)
            with self.assertRaises(ccoll.InvalidArgumentError) as ctx:
                comp.set_param("bits", 9)
            self.assertIn("bits 9 is out of range 1..8", str(ctx.exception))
            with self.assertRaises(ccoll.InvalidArgumentError) as ctx:
                comp.set_param("density", 1000)
            self.assertIn("does not apply to a quant compressor", str(ctx.exception))
            with self.assertRaises(ccoll.InvalidArgumentError):
                comp.get_param("nonsense")
        self.assertEqual(ccoll.param_bounds("bits"), (1, 8))
        with ccoll.Compressor("topk:density=0.25") as comp:
            self.assertEqual(comp.get_param("density"), 250000)  # parts per million
        comp.destroy()  # idempotent
        with self.assertRaises(ccoll.InvalidArgumentError):
            comp.spec

    def test_shapes(self):
        comp = self._powersgd("powersgd:rank=2")
        with comp:
            comp.set_shapes([(64, 3, 3, 3), (64,), 10, (10, 64)])
            self.assertIn("shapes=64x27+64+10+10x64", comp.spec)
            self.assertEqual(comp.get_param(ccoll.Param.RANK), 2)
            with single_rank() as comm:
                x = np.random.default_rng().standard_normal(64 * 27 + 64 + 10 + 640).astype(np.float32)
                comm.all_reduce(x.copy(), compressor=comp)
                with self.assertRaises(ccoll.InvalidUsageError):
                    comm.all_reduce(x[:-1].copy(), compressor=comp)
        with ccoll.Compressor("quant") as comp, self.assertRaises(ccoll.InvalidArgumentError) as ctx:
            comp.set_shapes([(3, 3)])
        self.assertIn("powersgd only", str(ctx.exception))

    def test_shapes_are_checked_before_they_reach_c(self):
        comp = self._powersgd("powersgd:rank=2")
        with comp:
            with self.assertRaises(ccoll.InvalidArgumentError) as ctx:
                comp.set_shapes([(4, 4), (2**64 + 4, 4)])
            self.assertIn("set_shapes: shape 1, dimension 0 18446744073709551620 is out of range", str(ctx.exception))
            with self.assertRaises(ccoll.InvalidArgumentError) as ctx:
                comp.set_shapes([(2, 2**40, 2**40)])  # 2**80 columns
            self.assertIn("shape 0: the product of the dimensions after the first 1208925819614629174706176 is out",
                          str(ctx.exception))
            with self.assertRaises(ccoll.InvalidArgumentError) as ctx:
                comp.set_shapes([(4, 4.5)])
            self.assertIn("shape 0, dimension 1 must be an integer, not 4.5", str(ctx.exception))
            comp.set_shapes([np.int64(16), (np.int32(4), 4.0)])
            self.assertIn("shapes=16+4x4", comp.spec)

    def test_nul_in_spec_is_refused(self):
        # C would read "quant:bits=4" and ignore the rest.
        with self.assertRaises(ccoll.InvalidArgumentError) as ctx:
            ccoll.Compressor("quant:bits=4\0bits=8,garbage")
        self.assertIn("NUL", str(ctx.exception))

    def test_long_spec(self):
        # A powersgd spec lists every tensor's shape: longer than the first buffer ccCompressorGetSpec gets.
        comp = self._powersgd("powersgd:rank=4")
        with comp:
            comp.set_shapes([(1024, 512), (512,)] * 2000)
            spec = comp.spec
            self.assertGreater(len(spec), 16384)
            self.assertTrue(spec.endswith("shapes=" + "+".join(["1024x512+512"] * 2000)), spec[-100:])
            self.assertIn(spec, repr(comp))
            with ccoll.Compressor(spec) as again:
                self.assertEqual(again.spec, spec)


def _thread_rank(rank, nranks, uid, results):
    try:
        with ccoll.Communicator(nranks, uid, rank, timeout_ms=20000) as comm:
            x = np.full(1000, rank + 1, dtype=np.int64)
            comm.all_reduce(x)
            gathered = comm.all_gather(np.array([rank], np.int32))
            results[rank] = (x.copy(), gathered.ravel().copy())
    except BaseException as e:  # noqa: B902
        results[rank] = e


class _DictStore:
    """A key-value store shared by thread ranks: set(key, bytes) and a get(key) that waits for the key."""

    def __init__(self):
        self._values, self._cond = {}, threading.Condition()

    def set(self, key, value):
        with self._cond:
            self._values[key] = bytes(value)
            self._cond.notify_all()

    def get(self, key):
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._values, timeout=10):
                raise TimeoutError("key %s was never set" % key)
            return self._values[key]

    def add(self, key, amount):
        """torch's Store.add: the counter under key (0 if not set) plus amount, stored and returned."""
        with self._cond:
            value = int(self._values.get(key, b"0")) + amount
            self._values[key] = str(value).encode()
            self._cond.notify_all()
            return value


class _StoreView:
    """A new wrapper of the same store, as a framework may hand out for each call (a PrefixStore, a binding)."""

    def __init__(self, store):
        self._store = store

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key):
        return self._store.get(key)


def _store_rank(rank, nranks, store, results, view=False):
    try:
        sums = []
        for _ in range(2):  # two groups from one store
            with ccoll.Communicator.from_store(_StoreView(store) if view else store, rank, nranks,
                                               timeout_ms=10000) as comm:
                sums.append(int(comm.all_reduce(np.array([rank + 1], np.int64))[0]))
        results[rank] = sums
    except BaseException as e:  # noqa: B902
        results[rank] = e


class TestThreadRanks(unittest.TestCase):
    def _run_threads(self, nranks, rank_main):
        """Runs rank_main(r) on nranks threads, each given at most 60 s; a thread still running fails the test."""
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(nranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
            self.assertFalse(t.is_alive(), "a thread rank hangs")

    def test_ranks_as_threads(self):
        # ccCommInitRank blocks until every rank joins: with the GIL held during the call this would deadlock.
        nranks = 3
        uid = ccoll.get_unique_id()
        results = [None] * nranks
        self._run_threads(nranks, lambda r: _thread_rank(r, nranks, uid, results))
        for r, res in enumerate(results):
            self.assertNotIsInstance(res, BaseException, "rank %d: %r" % (r, res))
            np.testing.assert_array_equal(res[0], np.full(1000, 6))
            np.testing.assert_array_equal(res[1], np.arange(nranks))

    def test_a_collective_refused_inside_a_group_fails_the_peers_at_once(self):
        # The binding refuses rank 0's int16 all-reduce inside a group: the group must still end with the refusing
        # call it recorded, so that rank 1's group fails in the call check, naming rank 0, instead of waiting for the
        # timeout (20 s).
        nranks = 2
        uid = ccoll.get_unique_id()
        results = [None] * nranks

        def rank_main(rank):
            try:
                with ccoll.Communicator(nranks, uid, rank, timeout_ms=20000) as comm:
                    start = time.monotonic()
                    try:
                        with ccoll.group():
                            comm.all_reduce(np.ones(16, np.int16 if rank == 0 else np.float32))
                        error = None
                    except ccoll.CcollError as e:
                        error = (type(e).__name__, str(e))
                    after = comm.all_reduce(np.ones(4, np.float32))  # the communicator stays usable
                    results[rank] = (error, time.monotonic() - start, after.tolist())
            except BaseException as e:  # noqa: B902
                results[rank] = e

        self._run_threads(nranks, rank_main)
        for r, res in enumerate(results):
            self.assertNotIsInstance(res, BaseException, "rank %d: %r" % (r, res))
            self.assertLess(res[1], 10.0, "rank %d waited for the timeout: %r" % (r, res))
            self.assertEqual(res[2], [2.0] * 4)
        self.assertEqual(results[0][0][0], "InvalidArgumentError")
        self.assertIn("int16", results[0][0][1])
        self.assertEqual(results[1][0][0], "InvalidUsageError")
        self.assertIn("rank 0 refused the call", results[1][0][1])

    def _store_ranks(self, *extra):
        # 3 thread ranks sharing one store, each running _store_rank (two groups in a row); every group must work.
        nranks = 3
        store = _DictStore()
        results = [None] * nranks
        self._run_threads(nranks, lambda r: _store_rank(r, nranks, store, results, *extra))
        self.assertEqual(results, [[6, 6]] * nranks)

    def test_from_store_with_thread_ranks(self):
        # The k-th from_store of each rank uses the k-th key, though the ranks share a process and the store.
        self._store_ranks()

    def test_from_store_with_a_new_wrapper_per_call(self):
        # The count is per prefix and rank, not per store object: a second group through a new wrapper of the same
        # store must not read the first group's id.
        self._store_ranks(True)

    def test_from_store_refuses_a_place_another_group_took(self):
        # Two groups of processes, one per node, each calling from_store once with the default prefix, wrote and read
        # one key: ranks of the two groups joined one another (wrong sums, no error) and the rest timed out. Here the
        # other group's rank 1 has claimed its place under the key this call uses (this process's first with the
        # prefix): the call raises at once, naming the remedy.
        store, prefix = _DictStore(), "claimed-%d" % os.getpid()
        self.assertEqual(store.add("%s/0/unique_id/rank1" % prefix, 1), 1)
        start = time.monotonic()
        with self.assertRaises(ccoll.InvalidUsageError) as caught:
            ccoll.Communicator.from_store(store, 1, 2, prefix=prefix, timeout_ms=20000)
        self.assertLess(time.monotonic() - start, 5.0)
        self.assertIn("a prefix of its own", str(caught.exception))
        self.assertIn("%s/0/unique_id" % prefix, str(caught.exception))

    def test_from_store_groups_with_prefixes_of_their_own_share_a_store(self):
        # Two 2-rank groups at once through one store, a prefix each: each group sums its own ranks.
        store, results = _DictStore(), [None] * 4

        def rank_main(i):
            group, rank = divmod(i, 2)
            try:
                with ccoll.Communicator.from_store(store, rank, 2, prefix="node%d-%d" % (group, os.getpid()),
                                                   timeout_ms=10000) as comm:
                    results[i] = int(comm.all_reduce(np.array([i], np.int64))[0])
            except BaseException as e:  # noqa: B902
                results[i] = e

        self._run_threads(4, rank_main)
        self.assertEqual(results, [1, 1, 5, 5])


if __name__ == "__main__":
    unittest.main()
