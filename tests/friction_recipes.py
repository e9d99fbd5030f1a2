"""Recipes for tests/test_porting_frictions.py, importable by Dask workers as ``tests.friction_recipes:...``."""

from __future__ import annotations

import multiprocessing

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from elastic_tasks.recipe import TrainingRecipe

CLASSES = 3
EVAL_CAP = 4  # the job's max_batch_per_gpu in the system test


class Points(Dataset):
    """Dict samples: 8 features and a class from the first two (deterministic per index)."""

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor | int]:
        x = torch.randn(8, generator=torch.Generator().manual_seed(self.offset + i))
        return {"x": x, "label": int(x[0] > 0.3) + int(x[1] > 0.8)}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.head = nn.Linear(8, 32), nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(x)))

    def compute_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(self(batch["x"]), batch["label"])


def step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model.compute_loss(batch)  # a method of the user's model: fails on a DDP wrapper


def two_groups(named_parameters, lr: float) -> torch.optim.Optimizer:  # noqa: ANN001
    named = dict(named_parameters)
    return torch.optim.SGD([{"params": [named["hidden.weight"], named["hidden.bias"]]}, {"params": [named["head.weight"], named["head.bias"]], "lr": lr / 4}], lr=lr, momentum=0.9)


def plateau(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.ReduceLROnPlateau:
    # mode="min" on a metric that never improves: the LR halves at every evaluation after the first.
    return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0, threshold=0.0)


def sharded_eval(model: nn.Module, loader) -> dict[str, float]:  # noqa: ANN001
    preds, labels, sizes = [], [], []
    for batch in loader:
        preds.append(model(batch["x"]).argmax(1))
        labels.append(batch["label"])
        sizes.append(len(batch["label"]))
    pred, label = loader.gather(torch.cat(preds)), loader.gather(torch.cat(labels))
    largest = loader.gather(torch.tensor([max(sizes, default=0)])).max()
    scores = []
    for c in range(CLASSES):
        tp, fp, fn = (int(((pred == c) & (label == c)).sum()), int(((pred == c) & (label != c)).sum()), int(((pred != c) & (label == c)).sum()))
        scores.append(2 * tp / max(2 * tp + fp + fn, 1))
    return {"macro_f1": sum(scores) / CLASSES, "samples": float(len(label)), "largest_batch": float(largest), "world": float(loader.world)}


def plateau_recipe() -> TrainingRecipe:
    """Sharded evaluation every 0.4 s of rank 0's clock, feeding ReduceLROnPlateau."""
    return TrainingRecipe(
        name="plateau", build_model=Net, dataset=Points(512), step_fn=step, make_optimizer=two_groups, base_lr=0.2, base_batch=16,
        make_scheduler=plateau, scheduler_metric="largest_batch", eval_dataset=Points(203, offset=50_000), eval_fn=sharded_eval,
        eval_every_s=0.4, eval_sharded=True,
    )


class WorkerOnly(Net):
    """A model that builds only where the ranks run — as one whose weights sit on a volume only
    the GPU nodes mount; here: only in a worker process."""

    def __init__(self) -> None:
        if multiprocessing.parent_process() is None:  # the CLI's own process, not a worker's
            raise RuntimeError("builds only on the workers")
        super().__init__()


def rank0_eval(model: nn.Module, loader) -> dict[str, float]:  # noqa: ANN001
    logits = torch.cat([model(b["x"]) for b in loader])
    labels = torch.cat([torch.as_tensor(b["label"]) for b in loader])
    return {"loss": float(F.cross_entropy(logits, labels)), "accuracy": float((logits.argmax(1) == labels).float().mean())}


def worker_only_recipe() -> TrainingRecipe:
    return TrainingRecipe(
        name="worker-only", build_model=WorkerOnly, dataset=Points(256), step_fn=step, make_optimizer=two_groups, base_lr=0.1, base_batch=8,
        eval_dataset=Points(64, offset=9_000), eval_fn=rank0_eval, eval_every=4,
    )


def vector_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["x"]), batch["label"], reduction="none")  # not a scalar: the check says so


def vector_loss_recipe() -> TrainingRecipe:
    return TrainingRecipe(name="vector", build_model=Net, dataset=Points(16), step_fn=vector_step, make_optimizer=two_groups, base_lr=0.1, base_batch=4)
