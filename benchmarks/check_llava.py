"""Greedy LLaVA (images in the prompt) through the engine vs HF `generate`, on models and images no
test has seen.

Each case draws from --seed a tiny random LlavaConfig (CLIP image size and patch size, vision and
text sizes, feature layer(s), select strategy, a Llama, Qwen2 or Mistral text model), tight engine
limits (block size, few KV blocks so preemption can happen, a small token budget so chunked prefill
splits images), and a batch of mixed requests: text-only ones and ones with 1-2 pictures drawn with
numpy (noise, gradients, shapes; many sizes and aspect ratios; PNG or JPEG; RGB, RGBA or L). The
whole batch runs through the engine at once; each request is compared with HF
`LlavaForConditionalGeneration.generate` on that request alone. A divergence passes only at a
near-tie of HF's logits (top-2 margin < 1e-3). Exit status 1 if any divergence is not a near-tie.

    python benchmarks/check_llava.py --seed 0 --cases 3
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.request.sampling_params import SamplingParams
from tests.support.hf_llava import IMAGE_TOKEN, IMAGE_TOKEN_ID, VOCAB_SIZE, build_tokenizer
from tests.support.hf_models import _randomize

NEAR_TIE_MARGIN = 1e-3
TEXT_MODELS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}
WORDS = ("the", "river", "bends", "toward", "a", "quiet", "town", "where", "lamps", "glow", "and", "two",
         "birds", "sing", "over", "old", "stone")
MAX_OUTPUT = 12


@dataclass
class Case:
    seed: int
    text_model: str
    vision: dict[str, Any]
    text: dict[str, Any]
    feature_layer: int | list[int]
    strategy: str
    engine: dict[str, int]

    @property
    def image_tokens(self) -> int:
        return (self.vision["image_size"] // self.vision["patch_size"]) ** 2 + (self.strategy == "full")

    def describe(self) -> str:
        vision = self.vision
        window = f" window {self.text['sliding_window']}" if self.text.get("sliding_window") else ""
        return (f"{self.text_model} text {self.text['hidden_size']}h/{self.text['num_hidden_layers']}L{window}, "
                f"CLIP {vision['image_size']}px/{vision['patch_size']}p {vision['hidden_size']}h/"
                f"{vision['num_hidden_layers']}L, layer {self.feature_layer}, {self.strategy} "
                f"({self.image_tokens} image tokens), weights seed {self.seed}, engine {self.engine}")


def draw_case(rng: random.Random) -> Case:
    patch = rng.choice([4, 8])
    image_size = patch * rng.choice([2, 3, 4, 5])
    vision_heads = rng.choice([2, 4])
    vision_layers = rng.randint(2, 4)
    vision = {"hidden_size": vision_heads * rng.choice([8, 16]), "intermediate_size": rng.choice([32, 64]),
              "num_hidden_layers": vision_layers, "num_attention_heads": vision_heads, "image_size": image_size,
              "patch_size": patch, "projection_dim": 16, "hidden_act": rng.choice(["quick_gelu", "gelu"])}
    kv_heads = rng.choice([1, 2])
    heads = kv_heads * rng.choice([1, 2, 4])
    text_model = rng.choice(list(TEXT_MODELS))
    text = {"hidden_size": heads * rng.choice([8, 16, 32]), "intermediate_size": rng.choice([64, 128]),
            "num_hidden_layers": rng.randint(1, 3), "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    if text_model == "mistral":
        text["sliding_window"] = rng.choice([None, rng.randint(24, 96)])
    layers = list(range(-vision_layers - 1, 0))  # -vision_layers - 1: the embeddings' output
    feature_layer = rng.choice(layers) if rng.random() < 0.7 else sorted(rng.sample(layers, 2))
    case = Case(rng.randrange(1000), text_model, vision, text, feature_layer, rng.choice(["default", "full"]), {})
    block_size = rng.choice([4, 8, 16])
    longest = 2 * case.image_tokens + 30 + MAX_OUTPUT
    min_blocks = -(-longest // block_size) + 1  # the longest request fits alone
    case.engine = {"block_size": block_size, "num_kv_blocks": rng.randint(min_blocks, 2 * min_blocks),
                   "max_num_batched_tokens": rng.randint(6, 48), "max_num_seqs": rng.randint(2, 8)}
    return case


def write_model(case: Case, path: Path) -> Any:
    """The checkpoint, tokenizer and preprocessor config; returns the HF processor."""
    import transformers
    from transformers import (
        CLIPVisionConfig,
        GenerationConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    text = getattr(transformers, TEXT_MODELS[case.text_model])(
        vocab_size=VOCAB_SIZE, max_position_embeddings=1024, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=False, **case.text)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**case.vision), text_config=text,
                         image_token_id=IMAGE_TOKEN_ID, vision_feature_layer=case.feature_layer,
                         vision_feature_select_strategy=case.strategy, image_seq_length=case.image_tokens,
                         projector_hidden_act="gelu")
    torch.manual_seed(case.seed)
    model = LlavaForConditionalGeneration(config).float().eval()
    _randomize(model, case.seed)
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=0).save_pretrained(path)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(path)
    size = case.vision["image_size"]
    images = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    images.save_pretrained(path)
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=case.vision["patch_size"],
                          vision_feature_select_strategy=case.strategy, num_additional_image_tokens=1,
                          image_token=IMAGE_TOKEN)


def draw_image(rng: np.random.Generator) -> bytes:
    """A noise, gradient or shapes picture of a random size and aspect ratio, encoded."""
    from PIL import Image

    width, height = (int(side) for side in rng.integers(6, 120, size=2))
    kind = rng.choice(["noise", "gradient", "shapes"])
    if kind == "noise":
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    elif kind == "gradient":
        ys, xs = np.mgrid[0:height, 0:width]
        start, step = rng.uniform(0, 255, size=3), rng.uniform(-4, 4, size=(2, 3))
        pixels = np.clip(start + ys[..., None] * step[0] + xs[..., None] * step[1], 0, 255).astype(np.uint8)
    else:  # rectangles of flat colour on a flat background
        pixels = np.broadcast_to(rng.integers(0, 256, size=3, dtype=np.uint8), (height, width, 3)).copy()
        for _ in range(int(rng.integers(1, 5))):
            top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
            pixels[top:top + int(rng.integers(1, height + 1)), left:left + int(rng.integers(1, width + 1))] = \
                rng.integers(0, 256, size=3, dtype=np.uint8)
    mode = str(rng.choice(["RGB", "RGBA", "L"]))
    image = Image.fromarray(pixels, mode="RGB").convert(mode)
    if mode == "RGBA":  # a varying alpha channel, which preprocessing must drop as HF does
        alpha = rng.integers(0, 256, size=(height, width), dtype=np.uint8)
        image.putalpha(Image.fromarray(alpha, mode="L"))
    fmt = "PNG" if mode == "RGBA" else str(rng.choice(["PNG", "JPEG"]))
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


Requests = dict[str, tuple[str, list[bytes], int]]  # request id -> (prompt, images, max_tokens)


def draw_requests(rng: random.Random, np_rng: np.random.Generator, count: int) -> Requests:
    """About a quarter of them text-only, the rest with 1 or 2 images."""
    requests = {}
    for index in range(count):
        num_images = rng.choice([0, 1, 1, 2])
        parts = [" ".join(rng.choices(WORDS, k=rng.randint(0, 6))) for _ in range(num_images + 1)]
        prompt = IMAGE_TOKEN.join(parts) if num_images else parts[0] or "the"
        requests[f"r{index}"] = (prompt, [draw_image(np_rng) for _ in range(num_images)],
                                 rng.randint(1, MAX_OUTPUT))
    return requests


def run_engine(model_dir: Path, case: Case, requests: Requests) -> tuple[dict[str, list[int]], int]:
    """All requests in one engine at once; per request its greedy tokens, and the preemption count."""
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(model=str(model_dir), device="cpu"),
        cache=CacheConfig(block_size=case.engine["block_size"], num_kv_blocks=case.engine["num_kv_blocks"]),
        scheduler=SchedulerConfig(max_num_batched_tokens=case.engine["max_num_batched_tokens"],
                                  max_num_seqs=case.engine["max_num_seqs"])))
    tokens: dict[str, list[int]] = {request_id: [] for request_id in requests}
    for request_id, (prompt, images, max_tokens) in requests.items():
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(request_id, prompt, params, images=images)
    while engine.has_unfinished:
        for delta in engine.step():
            for choice in delta.choices:
                tokens[delta.request_id] += choice.token_ids
    return tokens, engine.scheduler.num_preemptions


def divergence_margin(model: Any, processor: Any, prompt: str, images: list[bytes], max_tokens: int,
                      ours: list[int]) -> float | None:
    """None if HF generates `ours` for this request alone; else HF's top-2 logit margin where they part."""
    from PIL import Image

    pictures = [Image.open(io.BytesIO(data)) for data in images] or None
    inputs = processor(text=prompt, images=pictures, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    theirs = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    if ours == theirs:
        return None
    position = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                    min(len(ours), len(theirs)))
    if position >= len(out.logits):
        return float("inf")  # a length mismatch is never a near-tie
    top2 = torch.topk(out.logits[position][0].float(), 2).values
    return float(top2[0] - top2[1])


def check_case(case: Case, workdir: Path, rng: random.Random, num_requests: int) -> int:
    """Print the case's result; returns how many divergences were not near-ties."""
    from transformers import LlavaForConditionalGeneration

    processor = write_model(case, workdir)
    requests = draw_requests(rng, np.random.default_rng(rng.randrange(2**32)), num_requests)
    ours, preemptions = run_engine(workdir, case, requests)
    model = LlavaForConditionalGeneration.from_pretrained(workdir, dtype=torch.float32).eval()
    equal = failures = 0
    for request_id, (prompt, images, max_tokens) in requests.items():
        margin = divergence_margin(model, processor, prompt, images, max_tokens, ours[request_id])
        if margin is None:
            equal += 1
            continue
        failures += margin >= NEAR_TIE_MARGIN
        verdict = "near-tie" if margin < NEAR_TIE_MARGIN else "NOT A NEAR-TIE"
        print(f"  {request_id} ({len(images)} images): diverges; HF top-2 margin {margin:.2e} ({verdict})")
    num_images = sum(len(images) for _, images, _ in requests.values())
    print(f"{case.describe()}: {equal}/{len(requests)} equal ({num_images} images, {preemptions} preemptions)",
          flush=True)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10, help="requests per case")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    failures = 0
    for index in range(args.cases):
        with tempfile.TemporaryDirectory(prefix=f"llava-check-{index}-") as workdir:
            failures += check_case(draw_case(rng), Path(workdir), rng, args.requests)
    print("FAIL" if failures else "OK: every divergence (if any) is at a near-tie")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
