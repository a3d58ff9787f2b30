"""The binding in one process: ids, configs, compressors, errors (with the library's sentences), buffer checks, and
ranks as threads (which only works if every ccoll call releases the GIL)."""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
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

    def test_cuda_device_reaches_the_config(self):
        from ccoll import communicator
        self.assertIsNone(communicator._config(None, None, None))
        self.assertEqual(communicator._config(None, None, None, 3).cudaDev, 3)
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
            with self.assertRaisesSentence(ccoll.InvalidArgumentError, "numpy dtype uint8"):
                comm.all_reduce(np.zeros(4, np.uint8))
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


class TestCompressor(unittest.TestCase):
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
        try:
            comp = ccoll.Compressor("powersgd:rank=2")
        except ccoll.InvalidUsageError as e:  # a build without BLAS has no PowerSGD
            self.skipTest(str(e))
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


def _thread_rank(rank, nranks, uid, results):
    try:
        with ccoll.Communicator(nranks, uid, rank, timeout_ms=20000) as comm:
            x = np.full(1000, rank + 1, dtype=np.int64)
            comm.all_reduce(x)
            gathered = comm.all_gather(np.array([rank], np.int32))
            results[rank] = (x.copy(), gathered.ravel().copy())
    except BaseException as e:  # noqa: B902
        results[rank] = e


class TestThreadRanks(unittest.TestCase):
    def test_ranks_as_threads(self):
        # ccCommInitRank blocks until every rank joins: with the GIL held during the call this would deadlock.
        nranks = 3
        uid = ccoll.get_unique_id()
        results = [None] * nranks
        threads = [threading.Thread(target=_thread_rank, args=(r, nranks, uid, results)) for r in range(nranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
            self.assertFalse(t.is_alive(), "a thread rank hangs")
        for r, res in enumerate(results):
            self.assertNotIsInstance(res, BaseException, "rank %d: %r" % (r, res))
            np.testing.assert_array_equal(res[0], np.full(1000, 6))
            np.testing.assert_array_equal(res[1], np.arange(nranks))


if __name__ == "__main__":
    unittest.main()
