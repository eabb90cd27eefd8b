"""Does a reduce sink fold the padding columns of a partial last tile? (issue 40, item 2)

A ColVecReduce(add) of ``acc + 1.0`` over N = 200 (one full 192-wide tile and a partial one of 8 columns) on the GPU
against the emulator: if the kernel folds the fn's value at the 184 padding columns (acc = 0 there), each row's sum
comes out 184 too high. The same for max_abs of ``acc - 5.0`` (a padding value of 5 would win for small acc), and
for ``acc * acc`` (0 at the padding: right either way).

    python bench/probes/sink_padding_probe.py        # on a GPU
"""

from __future__ import annotations

import torch

from coda_agent.primitives import ColVecReduce, Config, backend, epilogue, gemm


@epilogue(reduces={"s": ColVecReduce(), "sq": ColVecReduce(), "mx": ColVecReduce(combine="max_abs"),
                   "mn": ColVecReduce(combine="max")})
def probe(acc):
    return {"D": acc, "s": acc + 1.0, "sq": acc * acc, "mx": acc * 0.01 - 5.0, "mn": acc * 0.0 - 3.0}


def main() -> None:
    torch.manual_seed(0)
    m, n, k = 256, 200, 128
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for cfg in (Config(tile_m=128, tile_n=192), Config(tile_m=128, tile_n=128)):
        with backend.using("quack"):
            gpu = gemm(probe, x, w.t(), config=cfg)
        with backend.using("torch"):
            emu = gemm(probe, x.cpu(), w.cpu().t(), config=cfg)
        for name in ("s", "sq", "mx", "mn"):
            diff = (gpu[name].cpu() - emu[name]).abs().max().item()
            print(f"tile_n {cfg.tile_n} (padding {(-n) % cfg.tile_n} columns): sink {name}: max |gpu - emulator| = {diff:.4g}; "
                  f"row 0 gpu {gpu[name][0].item():.4f} emulator {emu[name][0].item():.4f}")


if __name__ == "__main__":
    main()
