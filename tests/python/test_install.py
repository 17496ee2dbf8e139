"""`pip install --no-build-isolation` of the repository into a temporary
--target folder, then `import k3pack` from there (not from the checkout).

Slow (a CMake build of the extension), so it runs only with K3PACK_TEST_PIP=1.
K3PACK_BUILD_DIR selects the CMake build directory pip's build reuses."""

import os
import subprocess
import sys
import unittest

import _util


@unittest.skipUnless(os.environ.get("K3PACK_TEST_PIP") == "1", "set K3PACK_TEST_PIP=1 to run the pip install test")
class PipInstall(unittest.TestCase):
    def test_install_into_target_and_import(self):
        tmp = _util.TempDir()
        try:
            target = os.path.join(tmp.path, "site")
            env = dict(os.environ)
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps",
                                   "--no-index", "--target", target, _util.REPO],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            self.assertEqual(proc.returncode, 0, proc.stdout[-4000:])
            self.assertTrue(any(n.startswith("_k3pack") and n.endswith(".so")
                                for n in os.listdir(os.path.join(target, "k3pack"))))
            env["PYTHONPATH"] = target
            code = ("import k3pack, k3pack.sglang, os; "
                    "assert k3pack.__file__.startswith(%r), k3pack.__file__; "
                    "print(k3pack.__version__, k3pack.ggml_type_info('Q2_K')['type_size'])" % target)
            out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env=env, cwd=tmp.path)
            self.assertEqual(out.returncode, 0, out.stdout)
            self.assertTrue(out.stdout.strip().endswith(" 84"), out.stdout)
            # The `k3pack` console script runs the CLI installed with the package.
            script = os.path.join(target, "bin", "k3pack")
            self.assertTrue(os.access(script, os.X_OK), os.listdir(target))
            env.pop("K3PACK_BIN", None)
            out = subprocess.run([sys.executable, script, "--version"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp.path)
            self.assertEqual(out.returncode, 0, out.stdout)
            self.assertRegex(out.stdout, r"^k3pack \d+\.\d+\.\d+ \(git ")
            # The license travels with the distribution metadata.
            dist = [n for n in os.listdir(target) if n.startswith("k3pack-") and n.endswith(".dist-info")]
            self.assertEqual(len(dist), 1, os.listdir(target))
            with open(os.path.join(target, dist[0], "METADATA"), encoding="utf-8") as f:
                self.assertIn("License: Apache-2.0", f.read())
            self.assertTrue(any("LICENSE" in n for n in os.listdir(os.path.join(target, dist[0]))))
            # CMake builds in parallel and its progress is in the build log.
            self.assertRegex(proc.stdout, r"k3pack build: cmake --build .* -j \d+")
        finally:
            tmp.cleanup()


if __name__ == "__main__":
    unittest.main()
