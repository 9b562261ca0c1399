"""Distillation on Fashion-MNIST: a plain ViT alone and taught by the main job's CNN.

Each round (seed `--seed` + r) trains, each in a fresh process and at the
same epochs (9, the main job's):

- the teacher: the CNN that the main job has to beat
  (`benchmarks/main_job_vs_cnn.py`), saved as a `.keras` file;
- the student alone: `keras-vit train --model small/4`, a ViT without a
  convolutional stem (4x4-pixel patches embedded from the pixels, 4 blocks
  of width 64: where a ViT lacks a CNN's inductive biases);
- the student distilled from the teacher: the same command with
  `--teacher` and each of `--students`' settings (hard distillation through
  the class token, hard through DeiT's distillation token, soft).

The students run in alternating order. It reports each run's test accuracy
and seconds (wall-clock from process start to exit, and `fit`'s), the
medians over rounds, and whether the distilled students beat their teacher.
The day's fp32 GEMM rate is measured first.

    python benchmarks/distillation.py                      # 1 round, about 20 minutes here
    python benchmarks/distillation.py --rounds 3 --json distillation.json
    python benchmarks/distillation.py --quick              # 1 epoch on 1,024 images
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from harness import fresh_process, gemm_gflops
from main_job_vs_cnn import run_cnn

STUDENTS = {
    "alone": [],
    "hard": ["--distillation", "hard"],
    "hard+token": ["--distillation", "hard", "--distillation-token"],
    "soft": ["--distillation", "soft", "--temperature", "3"],
}


def run_student(name, backend, quick, seed, teacher):
    output = tempfile.mkdtemp(prefix="keras_vit_distillation_")
    command = [sys.executable, "-m", "keras_vit_launcher", "train", "--model", "small/4"]
    command += ["--seed", str(seed), "--output-dir", output]
    if quick:
        command += ["--epochs", "1", "--limit", "1024"]
    if name != "alone":
        command += ["--teacher", teacher, *STUDENTS[name]]
    try:
        _, wall = fresh_process(command, backend)
        with open(os.path.join(output, "metrics.json")) as f:
            metrics = json.load(f)
    finally:
        shutil.rmtree(output, ignore_errors=True)
    return {
        "student": name,
        "seed": seed,
        "test_accuracy": metrics["test_accuracy"],
        "wall_seconds": wall,
        "fit_seconds": metrics["fit_seconds"],
        "parameters": metrics["parameters"],
    }


def summarise(rounds, students):
    median = statistics.median
    teacher = median([r["teacher"]["test_accuracy"] for r in rounds])
    summary = {
        "teacher": {
            "test_accuracy": teacher,
            "wall_seconds": round(median([r["teacher"]["wall_seconds"] for r in rounds]), 1),
        }
    }
    for name in students:
        runs = [r[name] for r in rounds]
        accuracy = median([run["test_accuracy"] for run in runs])
        summary[name] = {
            "test_accuracy": accuracy,
            "wall_seconds": round(median([run["wall_seconds"] for run in runs]), 1),
            "fit_seconds": round(median([run["fit_seconds"] for run in runs]), 1),
            "points_over_teacher": round(100 * (accuracy - teacher), 2),
            "rounds_beating_teacher": sum(
                r[name]["test_accuracy"] > r["teacher"]["test_accuracy"] for r in rounds
            ),
        }
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax", "torch"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--students", nargs="+", default=list(STUDENTS), choices=tuple(STUDENTS), metavar="NAME"
    )
    parser.add_argument("--quick", action="store_true", help="1 epoch on 1,024 images")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be positive, not {args.rounds}")
    gemm_size = 1024 if args.quick else 4096
    results = {
        "backend": args.backend,
        "gemm_fp32_gflops": gemm_gflops(gemm_size),
        "quick": args.quick,
        "rounds": [],
    }
    print(
        f"GEMM {gemm_size}^3 fp32 (TensorFlow): {results['gemm_fp32_gflops']} GFLOP/s", flush=True
    )
    with tempfile.TemporaryDirectory(prefix="keras_vit_teacher_") as directory:
        for index in range(args.rounds):
            seed = args.seed + index
            teacher_path = os.path.join(directory, f"teacher-{seed}.keras")
            runs = {"teacher": run_cnn(args.backend, args.quick, seed, save=teacher_path)}
            print(
                f"round {index + 1} teacher (CNN) seed {seed}: accuracy "
                f"{runs['teacher']['test_accuracy']:.4f}, {runs['teacher']['wall_seconds']} s",
                flush=True,
            )
            order = args.students if index % 2 == 0 else args.students[::-1]
            for name in order:
                runs[name] = run_student(name, args.backend, args.quick, seed, teacher_path)
                print(
                    f"round {index + 1} student {name} seed {seed}: accuracy "
                    f"{runs[name]['test_accuracy']:.4f}, {runs[name]['wall_seconds']} s "
                    f"(fit {runs[name]['fit_seconds']} s)",
                    flush=True,
                )
            results["rounds"].append(runs)
    results["summary"] = summary = summarise(results["rounds"], args.students)
    print("\n| model | test accuracy | vs teacher (points) | seconds (fit) |")
    print("|---|---|---|---|")
    teacher = summary["teacher"]
    print(f"| CNN teacher | {teacher['test_accuracy']:.2%} | | {teacher['wall_seconds']} |")
    for name in args.students:
        row = summary[name]
        print(
            f"| ViT small/4 {name} | {row['test_accuracy']:.2%} | "
            f"{row['points_over_teacher']:+.2f} | {row['wall_seconds']} ({row['fit_seconds']}) |"
        )
    print(
        f"(medians of {args.rounds} round(s) on {args.backend}; "
        f"GEMM {results['gemm_fp32_gflops']} GFLOP/s)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
