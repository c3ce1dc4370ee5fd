"""How far the integer products (the ``auto`` default) move logits from the exact ones, and what SmolLM2 answers.

Usage:
    python benchmarks/compute/fidelity.py [--mode auto] [--smollm2 FILE.gguf ...] [--tokens 24]

Prints two things, each from the products of this host (``kestrel_trio._kernels.plan`` says which they are):

* For every GGUF fixture in tests/fixtures/gguf, its decode steps teacher-forced along transformers' greedy
  tokens (the fixture's golden.npz) once with exact products (weights expanded to float32) and once with
  ``--mode``: per step, the largest logit difference relative to the step's largest exact logit; the table
  gives the largest and the median step, and in how many steps the top token is the same. This is what
  tests/gguf_in/test_integer_fidelity.py asserts bounds on; here are the figures themselves.
* For each ``--smollm2`` file (SmolLM2-135M-Instruct: the shipped Q4_1, or a file llama-quantize made from it),
  the README's question ("What is the capital of France?", the file's chat template) answered greedily up to
  ``--tokens`` tokens or end of turn, and the plain continuation of "The capital of France is", in both modes,
  with the first token where the modes part.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from kestrel_trio import load_model

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "gguf"
QUESTION = "What is the capital of France?"  # the README's
CONTINUE = "The capital of France is"


def teacher_forced(path: Path, mode: str) -> tuple[np.ndarray, dict[str, str]]:
    """[steps, vocab] logits of each decode step along the fixture's golden greedy tokens, and each form's kernel."""
    golden = np.load(path.parent / "golden.npz")
    prompt, answer = golden["prompt_ids"].tolist(), golden["greedy_ids"].tolist()
    model = load_model(path, products=mode)
    cache = model.new_cache()
    rows = [model.step(cache, prompt, all_logits=True)[-1:]]  # [1, vocab]
    rows += [model.step(cache, [token], all_logits=True) for token in answer[:-1]]
    return np.concatenate(rows), model.kernel_report()["products"]  # [len(answer), vocab]


def fixture_table(mode: str) -> None:
    print(f"| fixture | kernels ({mode}) | max relative (median) | same top token |")
    print("|---|---|---|---|")
    for name in sorted(p.name for p in FIXTURES.iterdir() if (p / "golden.npz").exists()):
        path = FIXTURES / name / f"{name}.gguf"
        exact, _ = teacher_forced(path, "exact")
        fast, kernels = teacher_forced(path, mode)
        relative = np.abs(fast - exact).max(axis=1) / np.abs(exact).max(axis=1)  # [steps]
        same = int((fast.argmax(axis=1) == exact.argmax(axis=1)).sum())
        taken = ", ".join(f"{form} {kernel}" for form, kernel in sorted(kernels.items()))
        print(f"| {name} | {taken} | {relative.max():.1%} ({np.median(relative):.1%}) | {same} / {len(exact)} |",
              flush=True)


def greedy(model, ids: list[int], tokens: int) -> list[int]:
    """Greedy new token ids after ``ids`` (argmax, no penalty), stopping after an end-of-turn token."""
    cache = model.new_cache()
    logits = model.prefill(cache, ids)
    answer: list[int] = []
    while len(answer) < tokens and (not answer or answer[-1] not in model.tokenizer.eos_token_ids):
        answer.append(int(np.argmax(logits)))
        logits = model.step(cache, [answer[-1]])
    return answer


def smollm2_answers(path: Path, mode: str, tokens: int) -> None:
    print(f"\n{path.name}")
    answers = {}
    for products in ("exact", mode):
        model = load_model(path, products=products)
        chat = model.encode(model.apply_chat_template([{"role": "user", "content": QUESTION}]))
        answers[products] = [greedy(model, chat, tokens), greedy(model, model.tokenizer.encode(CONTINUE), tokens)]
        kernels = ", ".join(f"{form} {kernel}" for form, kernel in sorted(model.kernel_report()["products"].items()))
        for label, answer in zip(("chat", "continue"), answers[products]):
            print(f"  {products:8} {label:8} {model.decode(answer)!r}")
        print(f"  {products:8} kernels  {kernels}")
    for k, label in enumerate(("chat", "continue")):
        pairs = list(zip(answers["exact"][k], answers[mode][k]))
        parted = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        print(f"  {label}: {'the same tokens' if parted is None else f'modes part at new token {parted + 1}'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="auto", choices=("auto", "integer"),
                        help="the products compared with exact ones (auto: this host's integer kernels)")
    parser.add_argument("--smollm2", type=Path, nargs="*", default=[], help="SmolLM2-135M-Instruct GGUF files")
    parser.add_argument("--tokens", type=int, default=24, help="new tokens at most for each SmolLM2 answer")
    parser.add_argument("--no-fixtures", action="store_true", help="only the SmolLM2 answers")
    args = parser.parse_args()
    if not args.no_fixtures:
        fixture_table(args.mode)
    for path in args.smollm2:
        smollm2_answers(path, args.mode, args.tokens)


if __name__ == "__main__":
    main()
