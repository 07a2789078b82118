#!/usr/bin/env python3
"""test_compare_stats.py: scripts/compare_stats.py (the statistics of compare_modes.py) against
hand-computed cases and published t quantiles, and compare_modes.py's summary of synthetic runs
whose verdicts are known. Prints "ok - name" / "FAIL - name: detail" per test (test/run_tests.sh
counts them) through a unittest result class; exit status 1 on any failure.
"""
import json  # synthetic metrics
import math  # sqrt
import os  # paths
import shutil  # the scratch directory
import subprocess  # compare_modes.py --summarize-only
import sys  # exit status, the scripts folder
import tempfile  # scratch directory
import unittest  # the test cases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from compare_stats import mean_sd, moving_average, paired, t_cdf, t_quantile, verdict  # noqa: E402


class Stats(unittest.TestCase):
    def test_t_quantiles_match_tables(self):
        # two-sided 95% (p = 0.975) and 99% (p = 0.995) from the standard t table
        table = {1: (12.706, 63.657), 2: (4.303, 9.925), 3: (3.182, 5.841), 4: (2.776, 4.604), 5: (2.571, 4.032),
                 9: (2.262, 3.250), 10: (2.228, 3.169), 30: (2.042, 2.750), 120: (1.980, 2.617)}
        for df, (q975, q995) in table.items():
            self.assertAlmostEqual(t_quantile(0.975, df), q975, places=3, msg="df %d" % df)
            self.assertAlmostEqual(t_quantile(0.995, df), q995, places=3, msg="df %d" % df)
        self.assertAlmostEqual(t_quantile(0.975, 1e6), 1.95996, places=4)  # the normal's
        self.assertAlmostEqual(t_quantile(0.025, 4), -t_quantile(0.975, 4), places=12)

    def test_t_cdf(self):
        # df 1 is the Cauchy distribution: P(T <= t) = 1/2 + atan(t)/pi
        for t in (-3.0, -0.5, 0.0, 0.7, 2.0, 10.0):
            self.assertAlmostEqual(t_cdf(t, 1), 0.5 + math.atan(t) / math.pi, places=10)
        # df 2: P(T <= t) = 1/2 + t / (2 sqrt(2 + t^2))
        for t in (-2.0, 0.3, 1.5):
            self.assertAlmostEqual(t_cdf(t, 2), 0.5 + t / (2 * math.sqrt(2 + t * t)), places=10)

    def test_paired_hand_computed(self):
        # d = (0.10, 0.05, 0.20): mean 0.116667, sd = sqrt(0.011667 / 2) = 0.076376, se 0.044096,
        # t(0.975, 2) = 4.302653, half width 0.189733: [-0.073066, 0.306400]
        p = paired({1: 2.0, 2: 2.1, 3: 2.3}, {1: 1.9, 2: 2.05, 3: 2.1, 4: 9.9})
        self.assertEqual(p["seeds"], [1, 2, 3])
        self.assertEqual(p["n"], 3)
        self.assertAlmostEqual(p["mean"], 0.116667, places=6)
        self.assertAlmostEqual(p["sd"], 0.076376, places=6)
        self.assertAlmostEqual(p["lo"], -0.073066, places=5)
        self.assertAlmostEqual(p["hi"], 0.306400, places=5)
        self.assertEqual(verdict(p, 0.02)[1], "undecided")

    def test_verdicts(self):
        # a clear gap: d = (0.30, 0.32, 0.31), sd 0.01, half width 4.303 * 0.01 / sqrt(3) = 0.0248
        gap = paired({1: 2.30, 2: 2.32, 3: 2.31}, {1: 2.0, 2: 2.0, 3: 2.0})
        text, code = verdict(gap, 0.02)
        self.assertEqual(code, "gap")
        self.assertIn("gap seen (+0.31", text)
        # ruled out: d = (0.002, -0.001, 0.0005), sd 0.0015, half 0.0037: |ends| < 0.02
        small = paired({1: 2.002, 2: 1.999, 3: 2.0005}, {1: 2.0, 2: 2.0, 3: 2.0})
        text, code = verdict(small, 0.02)
        self.assertEqual(code, "ruled_out")
        self.assertAlmostEqual(float(text.split()[3]), max(abs(small["lo"]), abs(small["hi"])), places=2)
        # the same differences, a threshold below the interval's reach: undecided
        self.assertEqual(verdict(small, 0.001)[1], "undecided")
        # one seed: no interval
        one = paired({1: 2.0}, {1: 1.0})
        self.assertIsNone(one["lo"])
        self.assertEqual(verdict(one, 0.02)[1], "undecided")
        # the other direction: b worse
        neg = paired({1: 2.0, 2: 2.0, 3: 2.0}, {1: 2.5, 2: 2.6, 3: 2.55})
        self.assertEqual(verdict(neg, 0.02)[1], "gap")

    def test_mean_sd_and_smoothing(self):
        m, sd = mean_sd([1.0, 2.0, 4.0, float("nan")])
        self.assertAlmostEqual(m, 7 / 3)
        self.assertAlmostEqual(sd, math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
        self.assertEqual(mean_sd([]), (None, None))
        self.assertEqual(mean_sd([3.0]), (3.0, None))
        self.assertEqual(moving_average([1, 2, 3, 4], 2), [1.0, 1.5, 2.5, 3.5])


def write_run(root, mode, seed, val, passkey, steps=10, base=5.0):
    """A complete synthetic run: metrics.jsonl and config.json as train_gpt writes them."""
    d = os.path.join(root, mode, "seed_%d" % seed)
    os.makedirs(d)
    cfg = {"train": {"steps": steps, "seed": seed}, "data": {"seed": seed}, "precision": {"attention": mode},
           "log": {"dir": d}, "checkpoint": {"dir": d + "/checkpoints"}, "model": {"seq_len": 64}}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "loss": base + 1.0 / s + (val - 3.0), "lr": 1e-3, "grad_norm": 1.0,
                                "tokens_per_s": 1000.0, "elapsed_s": s}) + "\n")
        f.write(json.dumps({"step": steps, "val_loss": val, "val_tokens": 4096,
                            "val_pos": {"start": [0, 8], "end": [8, 64], "mean": [val + 0.5, val - 0.1],
                                        "tokens": [512, 3584]},
                            "val_source": {"a": {"mean": val, "tokens": 4096}}}) + "\n")
        f.write(json.dumps({"step": steps, "passkey": {"distance": [8, 16], "n": [4, 4], "accuracy": [passkey, passkey],
                                                       "accuracy_se": [0, 0], "p_answer": [0.5, 0.5],
                                                       "logp_answer": [math.log(passkey), math.log(passkey) - 1.0]}})
                + "\n")


class Summary(unittest.TestCase):
    def test_summary_of_known_runs(self):
        tmp = tempfile.mkdtemp()
        try:
            # naive worse than dm by ~0.3 nats on every seed; dm equal to bf16 within 0.002; passkey:
            # dm 0.8, naive 0.2 on every seed
            vals = {"bf16": (3.000, 3.010, 2.990), "fp8_naive": (3.300, 3.320, 3.310), "fp8_dm": (3.001, 3.009, 2.992)}
            pk = {"bf16": 0.8, "fp8_naive": 0.2, "fp8_dm": 0.8}
            for mode, vs in vals.items():
                for seed, v in zip((1, 2, 3), vs):
                    write_run(tmp, mode, seed, v, pk[mode] + 0.01 * seed)
            cfg = os.path.join(tmp, "cfg.json")
            with open(cfg, "w") as f:
                f.write("{}")
            r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compare_modes.py"), "--config", cfg,
                                "--out", tmp, "--modes", "bf16,fp8_naive,fp8_dm", "--seeds", "1,2,3",
                                "--summarize-only", "--no-plot"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            s = json.load(open(os.path.join(tmp, "summary.json")))
            comps = {(c["a"], c["b"]): c["metrics"] for c in s["comparisons"]}
            self.assertEqual(set(comps), {("fp8_naive", "fp8_dm"), ("fp8_dm", "bf16")})  # no hybrid ran
            nd = comps[("fp8_naive", "fp8_dm")]
            self.assertEqual(nd["final_val"]["verdict_code"], "gap")
            self.assertAlmostEqual(nd["final_val"]["mean"], (0.299 + 0.311 + 0.318) / 3, places=6)
            self.assertEqual(nd["passkey_accuracy"]["verdict_code"], "gap")
            self.assertAlmostEqual(nd["passkey_accuracy"]["mean"], -0.6, places=6)
            db = comps[("fp8_dm", "bf16")]
            self.assertEqual(db["final_val"]["verdict_code"], "ruled_out")
            self.assertEqual(db["passkey_accuracy"]["verdict_code"], "ruled_out")
            pm = s["per_mode"]["fp8_naive"]
            self.assertAlmostEqual(pm["final_val"]["mean"], 3.31, places=6)
            self.assertAlmostEqual(pm["final_val"]["sd"], 0.01, places=6)
            self.assertEqual(pm["val_by_position"][0]["start"], 0)
            self.assertAlmostEqual(pm["val_by_position"][0]["mean"], 3.81, places=6)
            md = open(os.path.join(tmp, "summary.md")).read()
            self.assertIn("| `fp8_naive` − `fp8_dm` | final val loss |", md)
            self.assertIn("gap seen", md)
            self.assertIn("ruled out above", md)
            # the answer's log-probability: paired like the rule's metrics, reported, not judged
            lp = next(c for c in s["comparisons"] if (c["a"], c["b"]) == ("fp8_naive", "fp8_dm"))["passkey_logp"]
            want = [math.log(0.2 + 0.01 * s) - math.log(0.8 + 0.01 * s) for s in (1, 2, 3)]
            self.assertEqual(lp["seeds"], [1, 2, 3])
            for got, w in zip(lp["diffs"], want):
                self.assertAlmostEqual(got, w, places=9)
            self.assertNotIn("verdict", lp)
            self.assertIn("| `fp8_naive` − `fp8_dm` | s1: %+.2f, s2: %+.2f, s3: %+.2f |" % tuple(want), md)
            # the train-loss difference curve: naive - dm = 0.3 - 0.001 ... per seed, constant over steps
            curve = [c for c in s["comparisons"] if c["a"] == "fp8_naive"][0]["train_diff"]["mean"]
            self.assertTrue(all(abs(v - 0.30933) < 1e-3 for _, v in curve), curve[:3])
        finally:
            shutil.rmtree(tmp)


class TapResult(unittest.TextTestResult):
    """One "ok - " / "FAIL - " line per test, the format test/run_tests.sh counts."""

    def addSuccess(self, test):
        super().addSuccess(test)
        print("ok - compare_stats: %s" % test._testMethodName, flush=True)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        print("FAIL - compare_stats: %s: %s" % (test._testMethodName, str(err[1]).replace("\n", " ")[:400]), flush=True)

    def addError(self, test, err):
        super().addError(test, err)
        print("FAIL - compare_stats: %s: error %s" % (test._testMethodName, str(err[1]).replace("\n", " ")[:400]),
              flush=True)


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(resultclass=TapResult, stream=open(os.devnull, "w"), verbosity=0).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)
