"""A mid-repo edit through `context.Workspace` and the engine costs only the hot copy and the question."""
from __future__ import annotations

import pytest

from checkpoint_helpers import cold, run
from context.workspace import Workspace
from engine.engine import Engine
from engine.request import SegmentKind

FILES = {
    "README.md": "# shop\n\nA small shop: models, pricing, cart and checkout.\n",
    "shop/models.py": "class Item:\n    def __init__(self, name, price):\n        self.name = name\n"
                      "        self.price = price\n",
    "shop/pricing.py": "from shop.models import Item\n\n\ndef discount(item: Item, rate: float) -> float:\n"
                       "    return item.price * (1 - rate)\n",
    "shop/cart.py": "from shop.pricing import discount\n\n\nclass Cart:\n    def __init__(self):\n"
                    "        self.items = []\n\n    def total(self):\n"
                    "        return sum(discount(i, 0.1) for i in self.items)\n",
    "shop/checkout.py": "from shop.cart import Cart\n\n\ndef checkout(cart: Cart) -> str:\n"
                        "    return f\"paid {cart.total():.2f}\"\n",
    "main.py": "from shop.checkout import checkout\nfrom shop.cart import Cart\n\nprint(checkout(Cart()))\n",
}


@pytest.fixture
def workspace(tmp_path, tiny_loaded):
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    ws = Workspace(tmp_path, tiny_loaded.tokenizer, persist=False, hot_share=0.5)  # a tiny repo
    ws.build()
    return ws


def test_mid_repo_edit_recomputes_only_the_edited_file_and_the_question(tiny_loaded, workspace):
    keys = [s.key for s in workspace.layout.segments]
    assert 2 < keys.index("shop/pricing.py") < len(keys) - 2  # an edit in the middle
    with Engine(tiny_loaded, prefill_chunk=16) as engine:
        run(engine, workspace.prompt("What does discount do?"))
        stable = workspace.layout.tokens
        workspace.update("shop/pricing.py", FILES["shop/pricing.py"].replace("1 - rate", "1 - 2 * rate"))
        segments = workspace.prompt("And now?")
        hot, question, header = segments[-3:]
        assert (hot.kind, question.kind, header.kind) == (SegmentKind.HOT, SegmentKind.QUESTION, SegmentKind.HEADER)
        tokens, done = run(engine, segments)
    m = done.metrics
    assert m.cached_tokens == stable  # every segment before the hot copy was restored
    assert m.recomputed_tokens == len(hot) + len(question) + len(header)
    assert tokens == cold(tiny_loaded, segments)


def test_second_edit_keeps_the_first_hot_copy(tiny_loaded, workspace):
    with Engine(tiny_loaded, prefill_chunk=16) as engine:
        workspace.update("shop/models.py", FILES["shop/models.py"] + "    currency = 'EUR'\n")
        run(engine, workspace.prompt("Currency?"))
        first_hot = workspace.layout.tokens
        workspace.update("shop/cart.py", FILES["shop/cart.py"].replace("0.1", "0.2"))
        segments = workspace.prompt("Rate?")
        assert [s.key for s in segments if s.kind == SegmentKind.HOT] == ["shop/models.py", "shop/cart.py"]
        tokens, done = run(engine, segments)
    assert done.metrics.cached_tokens == first_hot
    assert done.metrics.recomputed_tokens == sum(len(s) for s in segments[-3:])
    assert tokens == cold(tiny_loaded, segments)
