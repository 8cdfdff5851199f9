"""One calibration job: the base model's pass rate on a slice of the problem file.

For rows [start, stop) of `task.train` (the whole file, whatever the validation split), sample
`calibrate.samples` completions per problem with the sweep's sampler settings (temperature, top_p,
max_new_tokens) and check them with the task's verifier. Writes `calibration.parquet` (problem_id,
prompt, answer, pass_rate, samples, mean_response_tokens) into the job's directory and seals it as
finished; it knows nothing of Ray or of the other slices.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig

from isoflop_cli.recipe import checkpoint
from isoflop_cli.recipe.distributed import device
from isoflop_cli.recipe.rollouts import make_sampler, sampler_dtype
from isoflop_cli.samplers import SAMPLERS
from isoflop_cli.store import FAILED, RUNNING, RunFiles, atomic_write
from isoflop_cli.tasks.dataset import held_out

PROMPTS_PER_BATCH = 16  # prompts sampled together (each with calibrate.samples completions)


def calibrate(cfg: DictConfig, out: Path) -> pd.DataFrame:
    files = RunFiles(out)
    files.dir.mkdir(parents=True, exist_ok=True)
    start, stop = cfg.calibrate.rows
    files.set_status(RUNNING, pid=os.getpid(), rows=[start, stop])
    try:
        df = _calibrate(cfg, start, stop)
    except BaseException as e:
        files.set_status(FAILED, error=f"{type(e).__name__}: {e}")
        raise
    atomic_write(files.dir / "calibration.parquet", df.to_parquet(index=False))
    files.finish([{"step": 0, "problems": len(df)}])
    return df


def _calibrate(cfg: DictConfig, start: int, stop: int) -> pd.DataFrame:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    # The model as the sweep samples it: in bf16 with learner.bf16 (on by default with GPUs), on the
    # GPU when there is one; a vLLM engine reads the weights itself (the HF model: its structure only).
    own_engine = SAMPLERS[cfg.sampler.name].own_engine
    tokenizer, model = checkpoint.load(cfg.model, cfg.task, sampler_dtype(cfg), meta=own_engine)
    task = held_out(cfg.task, cfg.task.train, "task.train")  # every row of the file
    task.prepare(tokenizer)  # chat template; prompts over task.max_prompt_tokens are left out
    problems = [p for p in task.problems("val") if start <= int(p.id) < stop]
    texts = {r.index: r.text() for r in task.rows_of["val"]}
    sampler = make_sampler(cfg, model if own_engine else model.to(device()), tokenizer, task.max_prompt_tokens)
    m, started, out = cfg.calibrate.samples, time.time(), []
    torch.manual_seed(cfg.seed * 1_000_003 + start)
    for i in range(0, len(problems), PROMPTS_PER_BATCH):
        batch = problems[i : i + PROMPTS_PER_BATCH]
        rollouts = sampler.sample(
            [p.prompt for p in batch], m, cfg.algo.temperature, cfg.algo.top_p, cfg.task.max_new_tokens
        )
        verdicts = task.judge([p for p in batch for _ in range(m)], rollouts.texts)
        lengths = rollouts.completion_mask.sum(-1).tolist()
        for j, p in enumerate(batch):
            correct = sum(v.correct for v in verdicts[j * m : (j + 1) * m])
            out.append(
                {
                    "problem_id": int(p.id),
                    "prompt": texts[int(p.id)],
                    "answer": p.answer,
                    "pass_rate": correct / m,
                    "samples": m,
                    "mean_response_tokens": sum(lengths[j * m : (j + 1) * m]) / m,
                }
            )
        print(
            f"rows {start}-{stop}: {min(i + PROMPTS_PER_BATCH, len(problems))}/{len(problems)} "
            f"problems ({time.time() - started:.0f}s)",
            flush=True,
        )
    task.close()
    columns = ["problem_id", "prompt", "answer", "pass_rate", "samples", "mean_response_tokens"]
    return pd.DataFrame(out, columns=columns)
