"""A plain single-process PyTorch loop: the starting point of docs/porting.md."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return {"features": x, "label": int(x[:4].sum() > 0)}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 2))


def main(steps=200, batch=64, lr=1e-3):
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    loader = torch.utils.data.DataLoader(Rows(), batch_size=batch, shuffle=True, num_workers=2)
    step = 0
    while step < steps:
        for batch_ in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(batch_["features"]), batch_["label"])
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if step == steps:
                break
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
