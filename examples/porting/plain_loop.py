"""A plain single-process PyTorch loop: the starting point of docs/porting.md.

Dict batches, AdamW with parameter groups built by name (no weight decay on biases and norms,
the head at three times the LR), OneCycleLR (which also cycles Adam's beta1), a label-smoothed
training loss, and macro-F1 with plain cross-entropy on a held-out set every EVAL_EVERY steps.
``python plain_loop.py`` trains it; ``main(batches=...)`` replays given batches of indices.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

CLASSES, STEPS, BATCH, LR, EVAL_EVERY = 3, 30, 32, 1e-2, 10


class Rows(Dataset):
    """Sample i: 16 features and a class from the first three (deterministic per index)."""

    def __init__(self, n=2048, offset=0):
        self.n, self.offset = n, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.randn(16, generator=torch.Generator().manual_seed(self.offset + i))
        label = int(x[0] > 0.4) + int(x[1] + x[2] > 1.0)  # classes 0, 1, 2, unbalanced
        return {"features": x, "label": label}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.norm, self.head = nn.Linear(16, 64), nn.LayerNorm(64), nn.Linear(64, CLASSES)

    def forward(self, features):
        return self.head(F.gelu(self.norm(self.hidden(features))))

    def compute_loss(self, batch):
        return F.cross_entropy(self(batch["features"]), batch["label"], label_smoothing=0.1)


def make_optimizer(named_parameters, lr):
    named = list(named_parameters)
    no_decay = [p for n, p in named if n.endswith("bias") or n.startswith("norm.")]
    head = [p for n, p in named if n == "head.weight"]
    decay = [p for n, p in named if n == "hidden.weight"]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}, {"params": head, "lr": 3 * lr}]
    return torch.optim.AdamW(groups, lr=lr, weight_decay=0.05)


def make_scheduler(optimizer):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[g["lr"] for g in optimizer.param_groups], total_steps=STEPS)


def macro_f1(pred, label):
    scores = []
    for c in range(CLASSES):
        tp, fp, fn = [int(((pred == c) & (label == c)).sum()), int(((pred == c) & (label != c)).sum()), int(((pred != c) & (label == c)).sum())]
        scores.append(2 * tp / max(2 * tp + fp + fn, 1))
    return sum(scores) / CLASSES


def evaluate(model, loader):
    outputs = [(model(b["features"]), b["label"]) for b in loader]
    logits, labels = (torch.cat(t) for t in zip(*outputs))
    return {"macro_f1": macro_f1(logits.argmax(1), labels), "loss": float(F.cross_entropy(logits, labels))}


def eval_set():
    return Rows(512, offset=10_000)


def main(batches=None, steps=STEPS):
    """Train; returns each step's (loss, LR per group) and each evaluation's (step, metrics)."""
    torch.manual_seed(0)
    model = Classifier()
    opt = make_optimizer(model.named_parameters(), LR)
    sched = make_scheduler(opt)
    if batches is None:
        train = DataLoader(Rows(), batch_size=BATCH, shuffle=True, drop_last=True)
    else:
        train = DataLoader(Rows(), batch_sampler=batches)
    eval_loader = DataLoader(eval_set(), batch_size=256)
    history, evals, step = [], [], 0
    while step < steps:
        for batch in train:
            lrs = [g["lr"] for g in opt.param_groups]
            loss = model.compute_loss(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            history.append((loss.item(), lrs))
            step += 1
            if step % EVAL_EVERY == 0:
                model.eval()
                with torch.no_grad():
                    evals.append((step, evaluate(model, eval_loader)))
                model.train()
            if step == steps:
                break
    return history, evals, model


if __name__ == "__main__":
    history, evals, _ = main()
    print(f"loss {history[0][0]:.4f} -> {history[-1][0]:.4f}; evaluations {evals}")
