"""Getting the module out of whatever a model replies."""

from __future__ import annotations

from coda_agent.agent.extract import extract_code

MODULE = "from coda_agent.primitives import epilogue, gemm\n\n\ndef forward(x, w):\n    return {}\n"


def test_fenced_block_with_prose_around_it():
    reply = f"Here is my kernel.\n\n```python\n{MODULE}```\n\nIt fuses everything."
    assert extract_code(reply).code == MODULE


def test_the_last_complete_module_wins_over_snippets_and_drafts():
    draft = MODULE.replace("return {}", "return {'draft': 1}")
    reply = (
        "The epilogue will look like\n```python\nh = acc + c\n```\nFirst draft:\n```py\n" + draft + "```\n"
        "Improved final version:\n```python\n" + MODULE + "```\nUsage:\n```bash\ncoda-agent verify t x.py\n```\n"
    )
    assert extract_code(reply).code == MODULE


def test_a_broken_module_is_still_extracted_so_the_model_hears_about_its_syntax_error():
    broken = MODULE.replace("def forward(x, w):", "def forward(x, w)")
    extraction = extract_code(f"```python\n{broken}```")
    assert extraction.code == broken and extraction.error is None


def test_complete_module_preferred_over_a_later_broken_one():
    broken = MODULE.replace("def forward(x, w):", "def forward(x, w)")
    assert extract_code(f"```python\n{MODULE}```\n\n```python\n{broken}```").code == MODULE


def test_bare_file_tilde_fences_unlabelled_fences_and_cut_off_replies():
    assert extract_code(MODULE).code == MODULE
    assert extract_code(f"~~~python\n{MODULE}~~~").code == MODULE
    assert extract_code(f"```\n{MODULE}```").code == MODULE
    cut = extract_code("Sure:\n```python\nfrom coda_agent.primitives import gemm\n\ndef forward(x, w):\n    out = gemm(")
    assert cut.code is not None and cut.code.endswith("out = gemm(\n")


def test_thinking_sections_are_ignored():
    reply = f"<think>maybe\n```python\ndef forward(): return 1\n```\n</think>\nFinal:\n```python\n{MODULE}```"
    assert extract_code(reply).code == MODULE


def test_no_code_is_a_reason_not_a_crash():
    assert extract_code("I cannot write this kernel without more information.").code is None
    assert "no ```python block" in (extract_code("I cannot do that.").error or "")
    assert extract_code("   ").error == "the reply was empty"
    # a word that happens to parse as Python is not a module
    assert extract_code("OK").code is None
    # code in another language is not a candidate
    assert extract_code("```cuda\n__global__ void k() {}\n```").code is None
