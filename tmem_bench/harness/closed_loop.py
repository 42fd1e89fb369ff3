"""Closed-loop scoring: a trained model acting in the environment of a task that has one.

A task with an environment keeps the contract of `tmem_bench.contracts.environment` (POPGym's,
`tmem_bench.tasks.popgym`, are the built-in ones). The model acts greedily (the arg-max of its
logits) at every step from the observations so far, and the score is the mean episode return over
the task's fixed seeds.

Feeding the model each prefix again would cost a forward pass per step. Every backbone is causal
(each cell's causality probe checks it), so the output at step t depends on the observations up to
t alone, whatever follows them in the sequence. One pass over a guess of the whole episode (the
oracle's observations from the same seed) therefore gives the model's action at every step whose
observations so far the environment has confirmed; where the environment shows something else, the
real observation replaces the guess and the pass is run again. Where observations do not depend on
the actions (POPGym's card games) one pass per batch of episodes is exact.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import torch

from ..contracts.device import to_device
from ..contracts.environment import acts


def closed_loop_score(task, model, level: dict, device) -> dict:
    """{"closed_loop": {...}} for a task with an environment: the mean return of the model acting on
    the task's fixed seeds, each episode's return, and a fingerprint of the seeds; {} otherwise."""
    if not acts(task):
        return {}
    seeds = task.closed_loop_seeds(level)
    returns, passes = episode_returns(task, model, level, seeds, device)
    return {"closed_loop": {
        "mean_return": float(np.mean(returns)),
        "returns": returns,
        "n_episodes": len(seeds),
        "forward_passes": passes,
        "seeds_fingerprint": hashlib.sha256(json.dumps(seeds).encode()).hexdigest(),
    }}


@torch.no_grad()
def episode_returns(task, model, level: dict, seeds: list[int], device) -> tuple[list[float], int]:
    """The return of each episode (one per seed) with the model acting, and the forward passes it took."""
    was_training = model.training
    model.eval()
    envs = [task.make_env(level) for _ in seeds]
    length = envs[0].max_episode_length + 1
    guesses = [task.rollout(level, seed, env=task.make_env(level))["obs"] for seed in seeds]
    seq = np.zeros((len(seeds), length, guesses[0].shape[1]), dtype=np.int64)  # (N, T, F)
    for i, (env, seed, guess) in enumerate(zip(envs, seeds, guesses)):
        seq[i, :len(guess)] = guess
        seq[i, 0] = task.encode(env.reset(seed=seed)[0])
    position = np.zeros(len(seeds), dtype=np.int64)  # the step each episode acts at next
    returns = [0.0] * len(seeds)
    running = set(range(len(seeds)))
    passes = 0
    while running:
        batch = {"obs": torch.from_numpy(seq),
                 "positions": torch.arange(length).expand(len(seeds), -1).contiguous()}
        actions = model(to_device(batch, device)).argmax(-1).cpu().numpy()  # (N, T)
        passes += 1
        for i in sorted(running):
            while True:
                t = position[i]
                obs, reward, terminated, truncated, _ = envs[i].step(int(actions[i, t]))
                returns[i] += float(reward)
                if terminated or truncated:
                    running.discard(i)
                    break
                if t + 1 >= length:
                    raise RuntimeError(f"{task.name}: an episode ran past the environment's max_episode_length")
                position[i] = t + 1
                seen = task.encode(obs)
                if tuple(seq[i, t + 1]) != seen:
                    seq[i, t + 1] = seen  # the guess was wrong from here: the next pass sees the real step
                    break
    model.train(was_training)
    return returns, passes
