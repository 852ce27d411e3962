"""Speculative Jacobi decoding (SJD, coupled, relaxed): greedy SJD reproduces greedy AR token for token
(c2i and left-padded t2i, windows 1..16, every initialisation, CFG interval); a seed reproduces its image
and a batch equals single runs with seed + i; rolling the cache back equals recomputing it; zero budgets
reproduce the exact modes draw for draw; relaxed runs stay within their budget and accept more; the
initialisations copy what they claim; the auto window follows the cost curve; bad settings name the
parameter. (Distribution tests: test_jacobi_exactness.py; bound properties: test_jacobi_relaxed.py.)"""
import pytest
import torch

from lantern_core.conditioning import Condition
from lantern_core.config import SamplingConfig
from lantern_core.errors import ConfigError
from lantern_core.decoding.generate import generate
from lantern_core.conditioning import build_prefix
from lantern_core.decoding.generate import prefill
from lantern_core.decoding.jacobi.config import INITS, JacobiConfig
from lantern_core.decoding.jacobi.driver import jacobi_generate
from lantern_core.decoding.jacobi.state import JacobiContext, JacobiState
from lantern_core.decoding.jacobi.shape import JacobiShape
from lantern_core.decoding.jacobi.iteration import forward_window, refill
from lantern_core.decoding.jacobi.auto import choose_window, curve_sizes, expected_tokens
from lantern_core.decoding.acceptance.neighbors import build_neighbors
from lantern_core.decoding.acceptance.relaxation import Grouping, Relaxation
from lantern_core.decoding.sampling import make_generators
from lantern_core.decoding.cost_curve import CostCurve
from tests.tiny_models import TINY_C2I, TINY_T2I, random_gpt
from tests.tolerances import assert_close_to_reference, float64_copy, model_tolerance


def conditions(kind):
    if kind == "c2i":
        return random_gpt(TINY_C2I, seed=5), Condition.classes([2, 4])
    g = torch.Generator().manual_seed(9)
    mask = torch.tensor([[False, False, True, True, True, True], [True] * 6])
    return random_gpt(TINY_T2I, seed=5), Condition(caption=torch.randn(2, 6, 24, generator=g), caption_mask=mask)


@pytest.fixture(scope="module")
def c2i():
    model = random_gpt(TINY_C2I, seed=5, std=0.3)
    return model, build_neighbors(model.tok_embeddings.weight[: TINY_C2I.vocab_size], 8)


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
@pytest.mark.parametrize("window", [1, 3, 16])
def test_greedy_jacobi_equals_greedy_ar(kind, window):
    model, cond = conditions(kind)
    sampling = SamplingConfig(cfg_scale=3.0, cfg_interval=5, temperature=0.0)
    ar = generate(model, cond, sampling)
    for coupled in (False, True):
        for init in INITS:
            out = jacobi_generate(model, cond, sampling, JacobiConfig(window, coupled, init),
                                  make_generators(1, cond.batch))
            assert torch.equal(out.tokens, ar.tokens), (coupled, init)
            assert out.stats.forward_passes <= ar.stats.forward_passes * cond.batch


def test_same_seed_same_tokens_and_batch_equals_single_runs(c2i):
    model, neighbors = c2i
    cond = Condition.classes([2, 4])
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    for config in (JacobiConfig(6, coupled=True), JacobiConfig(5, init="repeat_above"),
                   JacobiConfig(7, coupled=True, relaxation=Relaxation(k=4, delta=0.2)),
                   JacobiConfig(7, coupled=True, init="sample_left", grouping=Grouping(k=4, gap=0.1))):
        a = jacobi_generate(model, cond, sampling, config, make_generators(7, 2), neighbors)
        b = jacobi_generate(model, cond, sampling, config, make_generators(7, 2), neighbors)
        assert torch.equal(a.tokens, b.tokens), config
        single = jacobi_generate(model, Condition.classes([4]), sampling, config, make_generators(8, 1), neighbors)
        assert torch.equal(single.tokens[0], a.tokens[1]), config
        assert sum(a.stats.accepted_histogram) == a.stats.iterations == a.stats.forward_passes - 2
        other = jacobi_generate(model, cond, sampling, config, make_generators(70, 2), neighbors)
        assert not torch.equal(other.tokens, a.tokens)


class _State:
    """A prefilled cache with a host-side committed length (what `forward_window` reads)."""

    def __init__(self, model, cond, spare):
        prefix = build_prefix(model, cond, True)
        rows, self.length = prefix.key_valid.shape
        max_len = self.length + model.config.num_image_tokens + spare
        self.cache = model.allocate_cache(rows, max_len)
        self.key_valid = torch.empty(rows, max_len, dtype=torch.bool)
        prefill(model, prefix, self.cache, self.key_valid)


def prefill_state(model, cond, guided, spare):
    assert guided
    return _State(model, cond, spare), None


def test_rollback_equals_recompute():
    """Verify a window whose tail is rejected, roll back by the length alone, verify the next window:
    its logits equal those of a cache filled from scratch with the accepted tokens only."""
    model, _ = conditions("c2i")
    cond = Condition.classes([3])
    state, _ = prefill_state(model, cond, guided=True, spare=16)
    first, drafts = torch.tensor([5]), torch.tensor([7, 1, 9, 2, 6])
    forward_window(model, state, torch.cat([first, drafts]))  # writes 6 slots
    state.length += 1 + 2  # keep the root and 2 drafts; 3 stale slots stay behind
    nxt = torch.tensor([4, 8, 3, 0])  # the token after them plus a new window
    rolled = forward_window(model, state, nxt)
    exact = float64_copy(model)  # the from-scratch cache in float64: the check needs no CPU's BLAS
    fresh, _ = prefill_state(exact, cond, guided=True, spare=16)
    recomputed = forward_window(exact, fresh, torch.cat([first, drafts[:2], nxt]))[:, 3:]
    tol = model_tolerance(rolled.dtype, model.config)  # the logits; the cached keys lie fewer reductions deep
    assert_close_to_reference(rolled, recomputed, tol)
    written = state.length + 4
    assert_close_to_reference(state.cache.keys[:, :, :, :written], fresh.cache.keys[:, :, :, :written], tol)
    stale, _ = prefill_state(model, cond, guided=True, spare=16)  # the same without the rollback differs
    forward_window(model, stale, torch.cat([first, drafts]))
    stale.length += 1 + 5
    wrong = forward_window(model, stale, nxt).double()
    assert (wrong - recomputed).abs().max() > 100 * tol * recomputed.abs().max()  # far beyond the tolerance


@pytest.mark.parametrize("rule", [Relaxation(k=8, delta=0.0), Relaxation(k=8, lam=1.0), Grouping(k=8, gap=0.0)],
                         ids=["delta0", "lambda1", "gap0"])
def test_zero_budgets_reproduce_the_exact_run_draw_for_draw(c2i, rule):
    model, neighbors = c2i
    cond = Condition.classes([1, 3])
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    exact = jacobi_generate(model, cond, sampling, JacobiConfig(8, coupled=True), make_generators(3, 2))
    kind = "relaxation" if isinstance(rule, Relaxation) else "grouping"
    relaxed = jacobi_generate(model, cond, sampling, JacobiConfig(8, coupled=True, **{kind: rule}),
                              make_generators(3, 2), neighbors)
    assert torch.equal(relaxed.tokens, exact.tokens)
    assert relaxed.stats.max_absorbed == 0.0 and relaxed.stats.relaxed_tokens == 0


@pytest.mark.parametrize("rule", [Relaxation(k=8, delta=0.3), Relaxation(k=8, lam=8.0), Grouping(k=8, gap=0.05)],
                         ids=["lantern", "lantern_pp", "gsd"])
def test_relaxed_runs_spend_at_most_their_budget_and_accept_more(c2i, rule):
    model, neighbors = c2i
    cond = Condition.classes(list(range(4)) * 2)
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    exact = jacobi_generate(model, cond, sampling, JacobiConfig(8, coupled=True), make_generators(11, 8))
    kind = "relaxation" if isinstance(rule, Relaxation) else "grouping"
    relaxed = jacobi_generate(model, cond, sampling, JacobiConfig(8, coupled=True, **{kind: rule}),
                              make_generators(11, 8), neighbors)
    assert relaxed.stats.relaxed_tokens > 0
    assert relaxed.stats.mean_accepted_length > exact.stats.mean_accepted_length
    if isinstance(rule, Relaxation) and rule.delta is not None:
        assert 0 < relaxed.stats.max_absorbed <= rule.delta + 1e-6
    assert kind in ("relaxation", "grouping") and relaxed.stats.tree.startswith("coupled jacobi w8")


def test_initialisations_copy_left_and_above():
    """The static refill's copy initialisations (copies of copies resolved in a fixed number of steps)."""
    model, _ = conditions("c2i")  # grid 4 x 4
    G, V = model.config.grid_size, model.config.vocab_size
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    for init, expect in (("repeat_left", lambda canvas, n: canvas[n - 1]),
                         ("repeat_above", lambda canvas, n: canvas[n - G] if n >= G else canvas[n - 1])):
        for emitted in (2, 7):  # the window starts inside the first image row, or past it
            shape = JacobiShape(2, 40, model.config.num_image_tokens, sampling, JacobiConfig(6, init=init))
            state = JacobiState.allocate(model, shape, None)
            state.start_image(1, torch.tensor([10]), torch.full((1, V), 1.0 / V))
            state.canvas[0, :emitted] = torch.arange(10, 10 + emitted)
            state.done.fill_(emitted)
            refill(JacobiContext(model, shape, None), state, torch.full((1, 6), 0.5))
            canvas, drafts, q = state.canvas[0], state.drafts[0], state.q[0]
            for j in range(6):
                assert int(drafts[j]) == int(expect(canvas, emitted + j)), (init, emitted, j)
                assert int(canvas[emitted + j]) == int(drafts[j])
                assert float(q[j, drafts[j]]) == 1.0 and float(q[j].sum()) == 1.0
            assert not state.proposed.any()


def test_auto_window_follows_the_cost_curve():
    histogram = [10, 10, 10, 10, 10, 10, 10, 10, 10, 10]  # 0..9 drafts accepted, equally often
    assert expected_tokens(histogram, 4) == pytest.approx(1 + (0 + 1 + 2 + 3 + 4 * 6) / 10)
    flat = CostCurve(((1, 1.0), (2, 1.0), (64, 1.0)), 0.0)  # a GPU: a wide window costs nothing
    steep = CostCurve(((1, 1.0), (2, 2.0), (64, 64.0)), 0.0)  # every token a full step
    assert choose_window(histogram, flat, 32).window >= 9
    choice = choose_window(histogram, steep, 32)
    assert choice.window == 1 and choice.tokens_per_s < choice.ar_tokens_per_s and "plain AR" in choice.note
    assert curve_sizes(33) == (1, 2, 4, 8, 16, 32, 33) and curve_sizes(1) == (1,)


def test_auto_window_run_reports_its_choice(c2i):
    model, _ = c2i
    sampling = SamplingConfig(cfg_scale=2.0, temperature=1.0)
    config = JacobiConfig("auto", coupled=True, max_window=12)
    a = jacobi_generate(model, Condition.classes([1]), sampling, config, make_generators(2, 1))
    b = jacobi_generate(model, Condition.classes([1]), sampling, config, make_generators(2, 1))
    assert torch.equal(a.tokens, b.tokens) and a.stats.tree == b.stats.tree
    window = int(a.stats.tree.split("jacobi w")[1].split(" ")[0])
    assert 1 <= window <= 12 and "(auto; about" in a.stats.tree


@pytest.mark.parametrize("kwargs,name", [({"window": 0}, "jacobi window"), ({"window": "wide"}, "jacobi window"),
                                         ({"init": "sideways"}, "jacobi init"), ({"max_window": 0}, "jacobi max_window"),
                                         ({"relaxation": Relaxation(4, delta=0.1), "grouping": Grouping()},
                                          "jacobi acceptance")])
def test_bad_settings_name_the_parameter(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        JacobiConfig(**kwargs)


def test_relaxation_without_a_neighbour_table_is_a_clear_error(c2i):
    model, _ = c2i
    with pytest.raises(ConfigError, match="neighbour table"):
        jacobi_generate(model, Condition.classes([1]), SamplingConfig(), JacobiConfig(4, relaxation=Relaxation(4, 0.1)))
