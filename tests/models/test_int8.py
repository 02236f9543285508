"""int8 weights (`treesearch.models.quantize`; the kernel itself: test_int8_kernel.py): a quantized
model keeps no float32 matrix and each int8 matrix once, blocked; its fast decode step reads the
modules' own int8 storage and decodes as its layers do; the project's
invariants hold within int8 (exact sharing equals --kv off, a search in solve_many equals it alone,
the same seed gives the same tree); the int8 copy is cached on disk and loads back the same; bad
requests are refused in one line."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch
from reliability_problems import Words
from same_results import assert_same

from strategies import BFS
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.engine import decoder
from treesearch.engine.local import Engine
from treesearch.models import int8_blocks, quantize
from treesearch.models.load import int8_folder, load_model, tiny_model
from treesearch.search.searcher import Searcher

LABELS = [" sure", " likely", " impossible"]
WORDS = " the cat sat on a mat and then it ran to big red house with one old dog".split()


def words(n: int, start: int = 0) -> str:
    return "".join(f" {WORDS[(start + i) % len(WORDS)]}" for i in range(n))


def run_both_paths(lm, prompts, cached, sampling):
    """Per path (fast_decode False, True): the generations of prompts after caching `cached`, and
    every decode step's logits."""
    out = {}
    for fast in (False, True):
        eng = Engine(lm, RKSCConfig(kv_sharing="exact", fast_decode=fast))
        assert (eng.forward.decoder is not None) == fast
        for text in cached:
            eng.generate([text], Sampling(max_new_tokens=2))
        steps: list[torch.Tensor] = []
        step = eng.forward.step

        def record(*a, _step=step, _steps=steps, **kw):
            logits = _step(*a, **kw)
            _steps.append(logits.clone())
            return logits

        eng.forward.step = record
        out[fast] = (eng.generate(prompts, sampling), steps)
    return out


def assert_sharing_equals_off(lm, prompts, sampling, score_prompts=None):
    """Generations (token ids) and label scores with kv_sharing exact equal those with it off."""
    out = {}
    for mode in ("off", "exact"):
        eng = Engine(lm, RKSCConfig(kv_sharing=mode))
        out[mode] = (eng.generate(prompts, sampling), eng.score(score_prompts or prompts, LABELS), eng.stats)
        eng.store.check_invariants()
    (g_off, s_off, _), (g_ex, s_ex, st_ex) = out["off"], out["exact"]
    assert [g.token_ids for g in g_ex] == [g.token_ids for g in g_off]
    for a, b in zip(s_off, s_ex):
        for lab in LABELS:
            assert b.probs[lab] == pytest.approx(a.probs[lab], abs=1e-4)
    assert st_ex.reused_tokens > 0  # the comparison exercised the shared path


@pytest.fixture(scope="module", params=["llama", "qwen2-own-head", "qwen2-tied"])
def int8_lm(request):
    """The tiny Llama, and the tiny Qwen2 with its own LM head and tied, quantized to int8."""
    if request.param == "llama":
        return load_model("tiny", quantization="int8")
    lm = tiny_model(seed=0, arch="qwen2", tied=request.param == "qwen2-tied")
    quantize.quantize(lm.model)
    return lm


@pytest.fixture(scope="module")
def tiny_int8():
    return load_model("tiny", quantization="int8")


def test_quantize_rows_round_trips_within_half_a_step():
    w = torch.randn(30, 50)
    w[3] = 0.0
    q, s = quantize.quantize_rows(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s[3] == 1.0
    assert int(q.abs().max()) == 127
    assert ((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-7).all()


def test_a_quantized_model_keeps_no_float32_matrix_and_the_decoder_reads_its_int8_storage(int8_lm):
    m = int8_lm.model
    assert quantize.is_quantized(m) and decoder.qualifies(m)
    tensors = [*m.parameters(), *m.buffers()]
    assert all(t.dim() < 2 or t.dtype == torch.int8 for t in tensors)  # norms, biases, scales: vectors
    assert not any(isinstance(mod, torch.nn.Linear) for mod in m.modules())
    assert all(t.dim() != 2 for t in tensors if t.dtype == torch.int8)  # every matrix blocked [N/16, K, 16]
    dec = decoder.decoder_for(m)
    att, mlp, fused = m.model.layers[0].self_attn, m.model.layers[0].mlp, m.model.layers[0].int8
    layer = dec.layers[0]
    nq = int8_blocks.blocks(att.q_proj.out_features)
    assert [w.data_ptr() for w in layer.qkv.ws] == [
        p.qweight.data_ptr() for p in (att.q_proj, att.k_proj, att.v_proj)
    ]
    assert att.q_proj.qweight.data_ptr() == fused.qkv.data_ptr()  # the fused buffer's first blocks
    assert att.k_proj.qweight.data_ptr() == fused.qkv[nq:].data_ptr()
    assert layer.gate_up.ws[1].data_ptr() == mlp.up_proj.qweight.data_ptr()
    assert mlp.gate_proj.qweight.data_ptr() == fused.gate_up.data_ptr()
    assert layer.down.ws[0] is mlp.down_proj.qweight and dec.head.ws[0] is m.lm_head.qweight
    tied = m.config.tie_word_embeddings
    assert (m.lm_head.qweight is m.model.embed_tokens.qweight) == tied


def test_the_int8_fast_step_decodes_as_the_int8_layers_do(int8_lm):
    """Greedy tokens identical, every step's logits within 1e-4 (the paths sum in other orders)."""
    base = words(20)
    prompts = [base + f" Row {b}:" + words(b, b) for b in range(4)]
    out = run_both_paths(int8_lm, prompts, [base, prompts[0]], Sampling(max_new_tokens=10, ignore_eos=True))
    (g_layers, s_layers), (g_fast, s_fast) = out[False], out[True]
    assert [g.token_ids for g in g_fast] == [g.token_ids for g in g_layers]
    assert len(s_fast) == len(s_layers) > 0
    for a, b in zip(s_layers, s_fast):
        assert (a - b).abs().max().item() <= 1e-4


def test_int8_logits_stay_near_float32s():
    f, q = load_model("tiny"), load_model("tiny", quantization="int8")
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000]])
    with torch.no_grad():
        a, b = f.model(ids).logits, q.model(ids).logits
    assert (a - b).abs().max().item() < 0.1 * a.abs().max().item()


@pytest.mark.parametrize("prefix_words", [0, 7, 40])
def test_int8_exact_sharing_equals_off(tiny_int8, prefix_words):
    prefix = " ".join(f"w{i}" for i in range(prefix_words))
    prompts = [prefix + f" branch {k}: the number is {k * 7}" for k in range(4)]
    assert_sharing_equals_off(tiny_int8, prompts, Sampling(max_new_tokens=12))


def test_int8_sampled_search_builds_the_same_tree_with_sharing_on_and_off(tiny_int8):
    trees = {}
    for kv in ("off", "exact"):
        problem = Words(depth=3, temperature=0.7, samples=2)
        res = Searcher(tiny_int8, problem, BFS(breadth=2), RKSCConfig(kv_sharing=kv), seed=0, progress=False)
        trees[kv] = res.solve("cats")
    assert len(trees["off"].tree) > 10
    assert_same([trees["off"]], [trees["exact"]])


def test_int8_solve_many_equals_each_input_solved_alone_and_the_same_seed_the_same_tree(tiny_int8):
    inputs = ["cats", "dogs", "birds", "fish"]
    problem = Words(width=2, depth=3, max_new_tokens=5, samples=2, temperature=0.9)

    def searcher():
        return Searcher(tiny_int8, problem, BFS(breadth=2), RKSCConfig(), progress=False, seed=5)

    alone = [searcher().solve(x) for x in inputs]
    assert_same(alone, list(searcher().solve_many(inputs, concurrency=3)))
    assert_same(alone, [searcher().solve(x) for x in inputs])


def test_the_int8_copy_is_cached_on_disk_and_loads_back_the_same(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "tiny-folder"
    lm = tiny_model(seed=2, arch="qwen2", tied=False)
    lm.model.save_pretrained(str(folder))
    lm.tokenizer.save_pretrained(str(folder))
    monkeypatch.setenv("TREESEARCH_CACHE", str(tmp_path / "cache"))
    first = load_model(str(folder), quantization="int8")
    said = capsys.readouterr().err
    assert "converted" in said and "int8 once" in said and " MB on disk" in said
    second = load_model(str(folder), quantization="int8")
    assert capsys.readouterr().err == ""
    assert quantize.is_quantized(second.model)
    # stored in the kernel's blocks, in a folder whose name says so (a plain-layout cache is not read)
    cached = int8_folder(folder)
    assert cached.parent.name == "int8-b16" and (cached / "model.safetensors").exists()
    saved = safetensors.torch.load_file(str(cached / "model.safetensors"))
    assert all(t.dim() == 3 and t.shape[2] == 16 for k, t in saved.items() if k.endswith("qweight"))
    with pytest.raises(ValueError, match="not in blocks of 16 channels; delete the int8 cache"):
        saved["model.layers.0.qkv.qweight"] = torch.zeros(8, 4, dtype=torch.int8)
        quantize.from_state(second.model.config, saved)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)
    prompts = ["the cat sat on", "a dog"]
    sampling = Sampling(max_new_tokens=6, ignore_eos=True)
    a, b = (Engine(x).generate(prompts, sampling) for x in (first, second))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_an_unknown_quantization_names_the_choices():
    with pytest.raises(ValueError, match="unknown quantization 'int4'; use one of: float32, int8"):
        load_model("tiny", quantization="int4")


def test_int8_refuses_another_device_or_dtype_or_model_type():
    with pytest.raises(ValueError, match="int8 runs on the CPU only, not on cuda"):
        load_model("tiny", device="cuda", quantization="int8")
    with pytest.raises(ValueError, match="int8 computes in float32, not torch.bfloat16"):
        load_model("tiny", dtype="bfloat16", quantization="int8")
    lm = tiny_model(seed=0, num_layers=1)
    lm.model.config.model_type = "gpt2"
    with pytest.raises(ValueError, match="int8 covers Llama and Qwen2 models, not model type 'gpt2'"):
        quantize.quantize(lm.model)


@pytest.fixture(scope="module")
def real_int8():
    return load_model(quantization="int8")


@pytest.mark.real_model
def test_real_model_int8_exact_equals_off_and_the_fast_step_equals_its_layers(real_int8):
    from treesearch.tasks import Game24

    g = Game24()
    states = [g.initial_state(p) for p in ("4 5 6 10", "1 1 4 6", "2 3 5 12")]
    prompts = [g.expand_prompt(s) for s in states]
    values = [g.value_prompt(s) for s in states]
    assert_sharing_equals_off(real_int8, prompts, Sampling(max_new_tokens=24, stop=("\n\n",)), values)
    both = run_both_paths(real_int8, prompts, [prompts[0]], Sampling(max_new_tokens=16))
    assert [g.token_ids for g in both[True][0]] == [g.token_ids for g in both[False][0]]


@pytest.mark.real_model
def test_real_model_int8_game24_in_solve_many_equals_alone_and_repeats(real_int8):
    from treesearch.tasks import Game24

    puzzles = ["4 5 6 10", "1 2 4 7"]

    def searcher():
        return Searcher(real_int8, Game24(), BFS(breadth=2), RKSCConfig(), progress=False)

    ref = [searcher().solve(x) for x in puzzles]
    assert_same(ref, list(searcher().solve_many(puzzles, concurrency=2)))
    assert_same(ref[:1], [searcher().solve(puzzles[0])])


def test_bench_precisions_run_int8_first_and_compare_decisions_with_float32():
    from treesearch.bench import precision

    assert precision.parse("int8,float32") == ["float32", "int8"]
    assert precision.run_order(["float32", "int8"]) == ["int8", "float32"]
    with pytest.raises(ValueError, match="use one or more of float32, int8"):
        precision.parse("int4")

    def doc(wall, decisions):
        mode = {"status": "ok", "wall_s": wall, "inputs_per_hour": 3600 / wall, "accuracy": 0.5}
        return {"modes": {"exact": {**mode, "decisions": decisions, "decisions_total": len(decisions)}}}

    cmp = precision.compare(
        {"float32": doc(10.0, ["a", "b", "c", "d"]), "int8": doc(4.0, ["a", "b", "x", "d"])},
        {"int8": 500.0, "float32": 900.0},
    )
    assert cmp["modes"]["exact"]["int8"]["agreement"] == 0.75
    assert cmp["modes"]["exact"]["int8"]["x_vs_float32"] == 2.5
    assert cmp["modes"]["exact"]["float32"]["agreement"] == 1.0
    assert "| exact | int8 | 4.0 | 900 | 2.50 | 75% of 4 | 50% |" in precision.markdown(cmp)


def test_an_early_exit_reads_the_labels_rows_of_the_int8_head(int8_lm):
    """CGEE's per-layer label softmax (`Forward.label_probs`) takes the int8 head's rows of the
    labels; a rule that never exits equals the full pass, one that exits at layer 2 runs 2 layers."""
    judge = ["Is 2 + 2 = 4? Answer:", "Is the sky green? Answer:"]
    full = Engine(int8_lm, RKSCConfig()).score(judge, LABELS)
    never = Engine(int8_lm, RKSCConfig()).score(judge, LABELS, exit_rule=lambda layer, probs: False)
    assert [s.layers_run for s in never] == [int8_lm.num_layers] * 2
    assert all(abs(x.probs[k] - y.probs[k]) <= 1e-5 for x, y in zip(full, never) for k in LABELS)
    early = Engine(int8_lm, RKSCConfig()).score(
        judge, LABELS, exit_rule=lambda layer, probs: torch.tensor([layer >= 2] * probs.shape[0])
    )
    assert [s.layers_run for s in early] == [2] * 2
    head = int8_lm.model.lm_head
    idx = torch.tensor([3, 7])
    plain = int8_blocks.unblock(head.qweight, head.out_features)
    assert torch.equal(head.weight_rows(idx), plain[idx].float() * head.scale[idx, None])
