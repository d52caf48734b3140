"""Which model fits this machine best for code questions: the rules behind the recommendation of
`codectx models` and `codectx doctor`.

**Fit.** codectx plans on `Budget.share` (70%) of the machine's memory, leaving the rest to the
OS, the editor and everything else; from that it sets aside the checkpoint budget
(`memory.checkpointBytes`, 2 GiB). A model fits when its weights and its KV cache for
`Budget.context_tokens` (8,192: the default prefix, focus and answer fill the default model's
whole context) fit in what is left:

- weights on Metal: a GGUF at the bits it is converted to (`engine.gguf.DEFAULT_GGUF_BITS`, or the
  file's own bits a weight where more: finer tensors stay at 8 bits; plus a float16 scale and bias
  per group of `engine.gguf_convert.GROUP_SIZE`), an mlx-lm directory at
  its size on disk; on the CPU: 4 bytes a parameter (codectx runs float32 there,
  `engine.loaded_model.weight_dtype`). A machine without Metal is judged as a CPU, a CUDA GPU
  included (conservative: its weights stay quantised);
- the KV cache: keys and values a token adds over all layers x tokens x 2 bytes (Metal) or 4 (CPU).

**Rank.** Among the models codectx can load that fit: those of at least 4 bits first (2- and
3-bit quantisations lose too much); then the highest score, log2(billions of parameters) plus the
family's bonus (`FAMILIES`: Qwen2.5-Coder and Qwen3-Coder +1, worth twice the parameters; Qwen3
+0.75; Qwen2.5 and Gemma 3 +0.5; Llama 3.x and other code-tuned families +0.25): a stated
preference for code questions, not a measurement; then the finer quantisation; then the smaller
need.

**Suggest.** The same rules over `CATALOGUE` (Qwen2.5-Coder in Ollama's library) name what to
get when nothing found fits and loads, or when a model from it would rank above the best found.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from engine.machine import Machine
from engine.model_library import FoundModel
from engine.model_shape import ModelShape, directory_shape, gguf_shape
from server.core.settings import MemorySettings

GIB = 1024**3
_CODE_TUNED = re.compile(r"coder|codellama|starcoder|codegemma|codestral|devstral")
_LLAMA3 = re.compile(r"llama[-_ .]?3")
_LOW_BITS = re.compile(r"^(?:t?q[123]|iq[123])|^[23]-bit$")


@dataclass(frozen=True)
class Family:
    """A model family as the ranking knows it."""

    label: str
    bonus: float
    code_tuned: bool = False


FAMILIES = {
    "qwen2.5-coder": Family("Qwen2.5-Coder (code-tuned)", 1.0, True),
    "qwen3-coder": Family("Qwen3-Coder (code-tuned)", 1.0, True),
    "qwen3": Family("Qwen3", 0.75),
    "qwen2": Family("Qwen2.5", 0.5),
    "gemma3": Family("Gemma 3", 0.5),
    "llama3": Family("Llama 3.x", 0.25),
    "code": Family("code-tuned (other family)", 0.25, True),
}


def family_of(architecture: str | None, names: str) -> Family:
    """The family of a model by its architecture and its names (spec, file, GGUF `general.name`)."""
    arch, names = (architecture or "").lower(), names.lower()
    code = bool(_CODE_TUNED.search(names))
    if arch.startswith("qwen3") and code:
        return FAMILIES["qwen3-coder"]
    if arch.startswith("qwen2") and code:
        return FAMILIES["qwen2.5-coder"]
    if arch.startswith("qwen3"):
        return FAMILIES["qwen3"]
    if arch.startswith("qwen2"):
        return FAMILIES["qwen2"]
    if arch.startswith("gemma3"):
        return FAMILIES["gemma3"]
    if arch == "llama" and _LLAMA3.search(names):
        return FAMILIES["llama3"]
    return FAMILIES["code"] if code else Family(arch or "unknown", 0.0)


@dataclass(frozen=True)
class Budget:
    """How much of a machine codectx plans on, and what a model must leave room for."""

    share: float = 0.70
    context_tokens: int = 8192
    """The default settings' prompt and answer: prefix 6000 + focus 1024 + answer 512 + the question."""
    checkpoint_bytes: int = MemorySettings().checkpoint_bytes
    gguf_bits: int | None = None
    """Bits a GGUF is converted to; None: `engine.gguf.DEFAULT_GGUF_BITS`."""

    def usable(self, machine: Machine) -> int | None:
        """Bytes left for weights and the KV cache (None when the memory is unknown)."""
        if not machine.memory_bytes:
            return None
        return int(machine.memory_bytes * self.share) - self.checkpoint_bytes


@dataclass(frozen=True)
class Profile:
    """What the rules read of one model, found or in the catalogue."""

    spec: str
    format: str
    architecture: str | None
    quantisation: str | None
    size_bytes: int
    shape: ModelShape | None
    names: str
    why_not: str | None = None


@dataclass(frozen=True)
class Assessment:
    """One model judged for one machine.

    Attributes:
        weights_bytes / kv_bytes: Its memory on this machine (None when its size is unknown).
        fits: Weights and KV cache fit what the budget leaves (False when unknown).
        why_not: Why it cannot be loaded, or why it cannot be judged; None otherwise.
    """

    profile: Profile
    family: Family
    weights_bytes: int | None
    kv_bytes: int | None
    fits: bool
    why_not: str | None

    @property
    def spec(self) -> str:
        return self.profile.spec

    @property
    def needs_bytes(self) -> int | None:
        return None if self.weights_bytes is None else self.weights_bytes + (self.kv_bytes or 0)

    @property
    def parameters(self) -> int | None:
        return self.profile.shape.parameters if self.profile.shape else None

    @property
    def low_bits(self) -> bool:
        return bool(_LOW_BITS.search((self.profile.quantisation or "").lower()))

    @property
    def score(self) -> float:
        return math.log2(max(self.parameters or 1, 1) / 1e9) + self.family.bonus

    def rank(self) -> tuple:
        """Bigger is better; only meaningful between loadable models that fit."""
        return (not self.low_bits, round(self.score, 6), _precision(self.profile.quantisation),
                -(self.needs_bytes or 0), self.spec)

    def describe(self) -> str:
        """E.g. "Qwen2.5-Coder (code-tuned), 7.6B parameters, Q4_K_M"."""
        count = self.parameters or 0
        params = f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M" if count else "size unknown"
        params += " parameters" if count else ""
        return f"{self.family.label}, {params}, {self.profile.quantisation or 'float'}"


@dataclass(frozen=True)
class Suggestion:
    """A model to get: the command and its assessment on this machine."""

    command: str
    spec: str
    download: str
    assessment: Assessment
    loads_now: bool


@dataclass(frozen=True)
class Choice:
    """The recommendation for one machine."""

    machine: Machine
    budget: Budget
    assessed: tuple[Assessment, ...]
    best: Assessment | None
    why: str
    get: Suggestion | None

    def to_json(self) -> dict[str, Any]:
        machine, get = self.machine, self.get
        return {
            "machine": {"memory_bytes": machine.memory_bytes, "apple_silicon": machine.apple_silicon,
                        "backend": "metal" if machine.metal else "cpu", "usable_bytes": self.budget.usable(machine)},
            "model": self.best.spec if self.best else None,
            "why": self.why,
            "get": None if get is None else {
                "command": get.command, "spec": get.spec, "download": get.download, "loads_now": get.loads_now,
                "why": fit_reason(get.assessment, machine, self.budget)},
        }


def profile_of(found: FoundModel) -> Profile:
    """A found model's profile; its shape is read only when codectx can load it."""
    shape, why = None, found.why_not
    if found.loadable:
        try:
            shape = gguf_shape(found.path, found.header) if found.format == "gguf" else directory_shape(found.path)
        except Exception as err:  # noqa: BLE001 - a model whose size is unreadable is not judged
            why = f"size unknown: {err}"
    if found.source in ("ollama", "lmstudio"):
        names = found.spec
    else:  # a hub repository's name, or a cache folder's: not the whole path ("/home/coder/...")
        names = " ".join(p for p in found.path.parts[-4:] if p.startswith("models--")) + " " + found.path.name
    return Profile(found.spec, found.format, found.architecture, found.quantisation, found.size_bytes, shape,
                   f"{names} {shape.names if shape else ''}", why)


def assess(profile: Profile, machine: Machine, budget: Budget) -> Assessment:
    """A model's memory on this machine and whether it fits."""
    family = family_of(profile.architecture, profile.names)
    if profile.shape is None:
        return Assessment(profile, family, None, None, False, profile.why_not or "size unknown")
    if machine.metal:
        weights = profile.size_bytes if profile.format == "mlx" else _converted_bytes(profile, budget)
        value_bytes = 2
    else:
        weights, value_bytes = profile.shape.parameters * 4, 4
    kv = profile.shape.kv_values_per_token * budget.context_tokens * value_bytes
    usable = budget.usable(machine)
    fits = usable is not None and weights + kv <= usable
    return Assessment(profile, family, weights, kv, fits, profile.why_not)


def choose(profiles: list[Profile], machine: Machine, budget: Budget | None = None) -> Choice:
    """The best model of `profiles` for `machine`, why, and what to get if something else is better."""
    budget = budget or Budget()
    assessed = tuple(assess(p, machine, budget) for p in profiles)
    usable = budget.usable(machine)
    candidates = [a for a in assessed if a.why_not is None and a.fits]
    best = max(candidates, key=Assessment.rank, default=None)
    get = _suggestion(machine, budget, best, {a.spec for a in assessed})
    if usable is None:
        why = "this machine's memory could not be read, so no model can be judged to fit"
    elif best is None:
        why = _none_fits(assessed, usable)
    else:
        why = fit_reason(best, machine, budget)
    return Choice(machine, budget, assessed, best, why, get)


def fit_reason(a: Assessment, machine: Machine, budget: Budget) -> str:
    """Why a model suits the machine: family, size, and the memory it leaves."""
    usable = budget.usable(machine) or 0
    needs = a.needs_bytes or 0
    return (f"{a.describe()}; needs {_gib(needs)} GiB (weights {_gib(a.weights_bytes or 0)} + KV cache "
            f"{_gib(a.kv_bytes or 0)} for {budget.context_tokens:,} tokens) of the {_gib(usable)} GiB codectx "
            f"plans on ({budget.share:.0%} of {_gib(machine.memory_bytes or 0)} GiB less "
            f"{_gib(budget.checkpoint_bytes)} GiB of checkpoints): {_gib(usable - needs)} GiB to spare")


def _none_fits(assessed: tuple[Assessment, ...], usable: int) -> str:
    if not assessed:
        return "no models found"
    unloadable = sum(1 for a in assessed if a.why_not is not None)
    too_big = [a for a in assessed if a.why_not is None and not a.fits]
    parts = [f"{unloadable} cannot be loaded"] if unloadable else []
    if too_big:
        smallest = min(a.needs_bytes or 0 for a in too_big)
        parts.append(f"{len(too_big)} need more than the {_gib(usable)} GiB codectx plans on "
                     f"(the smallest {_gib(smallest)} GiB)")
    return f"none of the {len(assessed)} models found loads and fits: {'; '.join(parts)}"


@dataclass(frozen=True)
class CatalogueEntry:
    """A model in Ollama's library, with the facts the rules need."""

    tag: str
    parameters: int
    layers: int
    kv_heads: int
    head_dim: int
    download_bytes: int
    architecture: str = "qwen2"
    quantisation: str = "Q4_K_M"

    def profile(self) -> Profile:
        shape = ModelShape(self.parameters, self.layers, self.layers * self.kv_heads * 2 * self.head_dim, self.tag)
        return Profile(f"ollama:{self.tag}", "gguf", self.architecture, self.quantisation, self.download_bytes,
                       shape, self.tag)


# Qwen2.5-Coder as Ollama's library serves it (Q4_K_M); parameters, blocks, KV heads and head size from
# the models' published configurations, download sizes as the library lists them.
CATALOGUE = (
    CatalogueEntry("qwen2.5-coder:0.5b", 494_000_000, 24, 2, 64, 398_000_000),
    CatalogueEntry("qwen2.5-coder:1.5b", 1_540_000_000, 28, 2, 128, 986_000_000),
    CatalogueEntry("qwen2.5-coder:3b", 3_090_000_000, 36, 2, 128, 1_900_000_000),
    CatalogueEntry("qwen2.5-coder:7b", 7_610_000_000, 28, 4, 128, 4_700_000_000),
    CatalogueEntry("qwen2.5-coder:14b", 14_700_000_000, 48, 8, 128, 9_000_000_000),
    CatalogueEntry("qwen2.5-coder:32b", 32_500_000_000, 64, 8, 128, 20_000_000_000),
)


def catalogue_choice(machine: Machine, budget: Budget | None = None) -> Assessment | None:
    """The catalogue model the rules pick for `machine` (None when none fits)."""
    budget = budget or Budget()
    fitting = [a for a in (assess(e.profile(), machine, budget) for e in CATALOGUE) if a.fits]
    return max(fitting, key=Assessment.rank, default=None)


def _suggestion(machine: Machine, budget: Budget, best: Assessment | None, found: set[str]) -> Suggestion | None:
    pick = catalogue_choice(machine, budget)
    if pick is None or pick.spec in found or (best is not None and best.rank()[:2] >= pick.rank()[:2]):
        return None
    from engine.gguf import SUPPORTED_ARCHITECTURES  # what codectx loads today

    tag = pick.spec.removeprefix("ollama:")
    return Suggestion(f"ollama pull {tag}", pick.spec, f"{pick.profile.size_bytes / 1e9:.1f} GB", pick,
                      pick.profile.architecture in SUPPORTED_ARCHITECTURES)


def _converted_bytes(profile: Any, budget: Budget) -> int:
    """A GGUF's weights once converted: `bits` a weight, but never fewer than the file's own
    (a conversion keeps tensors the file holds more finely at 8 bits, `engine.gguf_convert`),
    plus a float16 scale and bias per group."""
    from engine.gguf import DEFAULT_GGUF_BITS
    from engine.gguf_convert import GROUP_SIZE

    bits = budget.gguf_bits or DEFAULT_GGUF_BITS
    parameters = profile.shape.parameters
    if bits <= 8 and profile.size_bytes and parameters:
        bits = max(bits, min(8.0, profile.size_bytes * 8 / parameters))
    per_weight = bits + (32 / GROUP_SIZE if bits <= 8 else 0)
    return int(parameters * per_weight / 8)


def _precision(quantisation: str | None) -> float:
    """Bits of a quantisation name, a little more for K-quants and their larger mixes."""
    name = (quantisation or "F16").upper()
    match = re.search(r"(\d+)", name)
    bits = float(match.group(1)) if match else 16.0
    return bits + (0.5 if "_K" in name else 0) + (0.1 if name.endswith(("_M", "_L")) else 0)


def _gib(count: int) -> str:
    return f"{count / GIB:.1f}"
