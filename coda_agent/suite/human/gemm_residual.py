"""GEMM + residual add in one kernel: the residual tile arrives as the GEMM's C operand and is added to the
FP32 accumulator before the single rounding to bf16."""

from coda_agent.primitives import Config, epilogue, gemm, schedule


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   llama3-8b-o: 354.4 us, kept as written (nothing was 1% faster)
# coda-agent tune:   ragged: 464.3 -> 457.8 us
# coda-agent tune:   (those two: bench/results/h200-2026-12-02-h-tune-human.json; these: -g-tune-human.json)
# coda-agent tune:   llama3-8b-down: 1201.1 -> 1179.4 us
# coda-agent tune:   llama3-1b-down: 359.3 -> 344.3 us
@schedule({
    ('add_residual', 8000, 4000, 5000): Config(tile_m=192, pingpong=False),
    ('add_residual', 8192, 2048, 8192): Config(tile_n=256, pingpong=False),
    ('add_residual', 8192, 4096, 14336): Config(tile_n=256, pingpong=False),
})
def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
