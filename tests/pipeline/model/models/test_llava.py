"""LLaVA: images on the engine's path give HF LlavaForConditionalGeneration's greedy tokens, alone, in
batches mixed with text-only requests, split over prefill chunks and preempted; repeated images hit
the prefix cache and other images do not; bad images are clear errors."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.intake.image_processor import ImageProcessor
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import assert_greedy_equal
from tests.support.hf_llava import (
    IMAGE_TOKEN_ID,
    MAX_TOKENS,
    NUM_IMAGE_TOKENS,
    HFReference,
    image_processor,
    make_tiny_llava,
    random_image_bytes,
    solid_image_bytes,
)

PROMPTS = {  # prompt -> how many images it takes
    "The river <image> bends toward the": 1,
    "<image>": 1,
    "Two pictures: <image> and <image>, side by side": 2,
}


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llava(tmp_path_factory.mktemp("llava") / "tiny-llava")


@pytest.fixture(scope="module")
def llava_full_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The class token kept ("full"), two feature layers concatenated, a Qwen2 text model (qkv biases)."""
    return make_tiny_llava(tmp_path_factory.mktemp("llava-full") / "tiny-llava-full", seed=1, strategy="full",
                           feature_layer=[-3, -1], text_model_type="qwen2")


@pytest.fixture(scope="module")
def hf(llava_dir: Path) -> HFReference:
    return HFReference(llava_dir)


def make_engine(model_dir: Path, **overrides: Any) -> LLMEngine:
    model = {key: overrides.pop(key) for key in ("max_image_bytes", "max_image_pixels") if key in overrides}
    return LLMEngine(EngineConfig(
        model=ModelConfig(model=str(model_dir), device="cpu", **{"dtype": "float32", **model}),
        cache=CacheConfig(block_size=overrides.pop("block_size", 8), num_kv_blocks=overrides.pop("num_kv_blocks", 256),
                          enable_prefix_caching=overrides.pop("prefix_caching", True)),
        scheduler=SchedulerConfig(**overrides)))


def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def run(engine: LLMEngine, requests: dict[str, tuple[str, list[bytes]]]) -> dict[str, dict]:
    """Add all requests, then step until done; per request its output tokens and usage."""
    results = {request_id: {"tokens": [], "usage": None, "error": None} for request_id in requests}
    for request_id, (prompt, images) in requests.items():
        engine.add_request(request_id, prompt, greedy(), images=images)
    while engine.has_unfinished:
        for delta in engine.step():
            for choice in delta.choices:
                results[delta.request_id]["tokens"] += choice.token_ids
            if delta.usage is not None:
                results[delta.request_id]["usage"] = delta.usage
    return results


def images_for(prompt: str, seed: int) -> list[bytes]:
    sizes = [(48, 40), (30, 64), (32, 32)]
    return [random_image_bytes(seed * 10 + k, *sizes[(seed + k) % 3]) for k in range(PROMPTS[prompt])]


def assert_matches_hf(hf: HFReference, result: dict, prompt: str, images: list[bytes], label: str) -> None:
    _, theirs, logits = hf.generate(prompt, images)
    assert_greedy_equal(result["tokens"], theirs, logits, label)


# ---- preprocessing ------------------------------------------------------------------------------

@pytest.mark.parametrize(("width", "height", "mode", "fmt"), [
    (48, 40, "RGB", "PNG"), (20, 70, "RGB", "PNG"), (33, 32, "RGBA", "PNG"), (100, 31, "L", "PNG"),
    (16, 12, "RGB", "PNG"), (64, 48, "RGB", "JPEG")])
def test_pixels_equal_hf_clip_image_processor(llava_dir: Path, width: int, height: int, mode: str,
                                              fmt: str) -> None:
    from PIL import Image

    data = random_image_bytes(width * height, width, height, fmt=fmt, mode=mode)
    ours = ImageProcessor.from_model_dir(llava_dir)(data)
    theirs = image_processor()(Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
    assert ours.shape == theirs.shape == (3, 32, 32)
    np.testing.assert_array_equal(ours, theirs)


# ---- generation ---------------------------------------------------------------------------------

def test_prompt_ids_are_hf_processors_with_each_placeholder_expanded(llava_dir: Path, hf: HFReference) -> None:
    engine = make_engine(llava_dir)
    prompt = "Two pictures: <image> and <image>, side by side"
    images = images_for(prompt, 0)
    request = engine.builder.build("r", greedy(), prompt=prompt, images=images)
    assert request.prompt_token_ids == hf.generate(prompt, images)[0]
    assert request.prompt_token_ids.count(IMAGE_TOKEN_ID) == 2 * NUM_IMAGE_TOKENS
    assert [image.length for image in request.images] == [NUM_IMAGE_TOKENS] * 2


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_greedy_tokens_equal_hf_generate(llava_dir: Path, hf: HFReference, prompt: str) -> None:
    images = images_for(prompt, 1)
    result = run(make_engine(llava_dir), {"r": (prompt, images)})["r"]
    assert_matches_hf(hf, result, prompt, images, prompt)


def test_the_image_changes_the_output(llava_dir: Path) -> None:
    prompt = "The river <image> bends toward the"
    outputs = run(make_engine(llava_dir), {f"r{seed}": (prompt, images_for(prompt, seed)) for seed in range(3)})
    assert len({tuple(result["tokens"]) for result in outputs.values()}) == 3


def test_mixed_batch_of_text_and_image_requests_equals_hf_one_by_one(llava_dir: Path, hf: HFReference) -> None:
    requests = {
        "text-0": ("A plain text prompt about the river", []),
        "image-0": ("The river <image> bends toward the", images_for("The river <image> bends toward the", 2)),
        "text-1": ("Another one", []),
        "two-images": ("Two pictures: <image> and <image>, side by side",
                       images_for("Two pictures: <image> and <image>, side by side", 3)),
        "image-1": ("<image>", images_for("<image>", 4)),
    }
    engine = make_engine(llava_dir)
    results = run(engine, requests)
    assert engine.stats.num_steps == MAX_TOKENS  # all five ran side by side from the first step
    for request_id, (prompt, images) in requests.items():
        assert_matches_hf(hf, results[request_id], prompt, images, request_id)


def test_full_strategy_several_feature_layers_and_qwen2_text_equal_hf(llava_full_dir: Path) -> None:
    reference = HFReference(llava_full_dir, strategy="full")
    engine = make_engine(llava_full_dir)
    prompt = "The river <image> bends toward the"
    images = images_for(prompt, 5)
    request = engine.builder.build("probe", greedy(), prompt=prompt, images=images)
    assert request.images[0].length == NUM_IMAGE_TOKENS + 1  # the class token is kept
    assert_matches_hf(reference, run(engine, {"r": (prompt, images)})["r"], prompt, images, "full")


@pytest.mark.parametrize("budget", [5, 8, 13])
def test_chunked_prefill_splits_an_image_and_encodes_it_once(llava_dir: Path, hf: HFReference, budget: int) -> None:
    prompt = "Two pictures: <image> and <image>, side by side"
    images = images_for(prompt, 6)
    engine = make_engine(llava_dir, max_num_batched_tokens=budget)
    result = run(engine, {"r": (prompt, images)})["r"]
    assert_matches_hf(hf, result, prompt, images, f"budget {budget}")
    assert engine.runner.encoder_cache.num_encoded == 2  # each image once, however many chunks cover it


def test_preempted_image_requests_recompute_with_their_images(llava_dir: Path, hf: HFReference) -> None:
    prompt = "The river <image> bends toward the"
    requests = {f"r{seed}": (prompt, images_for(prompt, 10 + seed)) for seed in range(4)}
    # 4 requests of 24-34 tokens in 8-token blocks need ~16 blocks; 12 force preemptions.
    engine = make_engine(llava_dir, num_kv_blocks=12, prefix_caching=False)
    results = run(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    for request_id, (text, images) in requests.items():
        assert_matches_hf(hf, results[request_id], text, images, request_id)


# ---- prefix caching -----------------------------------------------------------------------------

def test_a_repeated_image_hits_the_prefix_cache_and_another_image_does_not(llava_dir: Path) -> None:
    prompt = "A long shared opening for the prefix cache: <image> and then the question"
    first, other = random_image_bytes(100), random_image_bytes(101)
    engine = make_engine(llava_dir, block_size=8)
    placeholder_start = engine.builder.build("probe", greedy(), prompt=prompt, images=[first]).images[0].offset
    baseline = run(engine, {"a": (prompt, [first])})["a"]
    repeated = run(engine, {"b": (prompt, [first])})["b"]
    different = run(engine, {"c": (prompt, [other])})["c"]
    prompt_tokens = baseline["usage"].prompt_tokens
    assert repeated["tokens"] == baseline["tokens"]
    # The whole prompt but its last (always recomputed) block, image blocks included.
    assert repeated["usage"].cached_tokens == (prompt_tokens - 1) // 8 * 8 > placeholder_start + NUM_IMAGE_TOKENS
    # Only the blocks that end before the first placeholder.
    assert different["usage"].cached_tokens == placeholder_start // 8 * 8
    assert different["tokens"] != baseline["tokens"]


def test_a_prefix_hit_ending_inside_an_image_computes_the_rest_of_it(llava_dir: Path, hf: HFReference) -> None:
    image = random_image_bytes(200)
    first, second = "Opening words then <image> and one ending", "Opening words then <image> but another"
    engine = make_engine(llava_dir, block_size=8)
    placeholder = engine.builder.build("probe", greedy(), prompt=second, images=[image]).images[0]
    run(engine, {"a": (first, [image])})
    result = run(engine, {"b": (second, [image])})["b"]
    # The prompts part right after the image, so the hit ends in the block holding its last placeholders.
    cached = result["usage"].cached_tokens
    assert placeholder.offset < cached < placeholder.end
    assert_matches_hf(hf, result, second, [image], "hit inside the image")


def test_the_same_image_hits_the_encoder_cache(llava_dir: Path) -> None:
    engine = make_engine(llava_dir, prefix_caching=False)
    image = random_image_bytes(7)
    run(engine, {"a": ("<image> first", [image]), "b": ("second <image>", [image])})
    assert engine.runner.encoder_cache.num_encoded == 1


# ---- errors -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_limits_engine(llava_dir: Path) -> LLMEngine:
    return make_engine(llava_dir, max_image_bytes=4000, max_image_pixels=64 * 64)


@pytest.mark.parametrize(("prompt", "images", "message"), [
    ("<image> text", [b"not an image at all"], "images[0] is not a decodable image"),
    ("<image> text", [random_image_bytes(9, fmt="PNG")[:300]], "images[0] is not a decodable image"),
    ("<image> text", [solid_image_bytes(80, 80)], "images[0] is 80x80 pixels; the limit is 4096"),
    ("<image> text", [random_image_bytes(2, 64, 64, fmt="BMP")], "images[0] is 12342 bytes; the limit is 4000"),
    ("<image> text", [random_image_bytes(3), random_image_bytes(4)], "1 <image> placeholder(s) but 2 image(s)"),
    ("<image> and <image>", [random_image_bytes(3)], "2 <image> placeholder(s) but 1 image(s)"),
    ("no placeholder", [random_image_bytes(3)], "0 <image> placeholder(s) but 1 image(s)"),
    ("<image> text", [], "1 <image> placeholder(s) but 0 image(s)"),
])
def test_bad_images_are_errors_naming_the_field(small_limits_engine: LLMEngine, prompt: str, images: list[bytes],
                                                message: str) -> None:
    with pytest.raises(ValueError, match="images") as error:
        small_limits_engine.builder.build("bad", greedy(), prompt=prompt, images=images)
    assert message in str(error.value)


def test_truncating_a_prompt_with_images_is_refused(small_limits_engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=4, truncate_prompt_tokens=4)
    with pytest.raises(ValueError, match="truncate_prompt_tokens cannot be used with images"):
        small_limits_engine.builder.build("bad", params, prompt="<image> text", images=[random_image_bytes(1)])


def test_images_for_a_text_only_model_are_refused(default_model_path: Path) -> None:
    from tests.support.engine_helpers import make_engine as make_text_engine

    builder = make_text_engine(default_model_path, num_kv_blocks=16).builder
    with pytest.raises(ValueError, match="images: this model takes no images"):
        builder.build("bad", greedy(), prompt="hello", images=[random_image_bytes(1)])
    with pytest.raises(ValueError, match=r"messages\[0\].content: image parts need a vision-language model"):
        builder.build("bad", greedy(), messages=[{"role": "user", "content": [{"type": "image"}]}])
    text_parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]
    assert builder.build("ok", greedy(), messages=[{"role": "user", "content": text_parts}]).prompt_token_ids == \
        builder.build("ok", greedy(), messages=[{"role": "user", "content": "hello\nthere"}]).prompt_token_ids


def test_a_request_resumed_after_a_crash_keeps_its_images(llava_dir: Path, hf: HFReference) -> None:
    """Another worker rebuilds the request from its wire entry (images included) and continues from
    the tokens the client already has; the output is the uninterrupted one."""
    from actors.worker.intake import build_request
    from pipeline.request.request import ResumeState
    from queue_adapters.codec import WireRequest

    prompt = "The river <image> bends toward the"
    images = images_for(prompt, 8)
    wire = WireRequest(id="resumed", prompt=prompt, images=images,
                       params={"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True})
    _, theirs, logits = hf.generate(prompt, images)
    engine = make_engine(llava_dir)
    request = build_request(engine.builder, wire)
    request.resume_from(ResumeState(next_seq=4, output_token_ids=[theirs[:4]], finish_reasons=[None],
                                    stop_reasons=[None]))
    engine.add(request)
    while engine.has_unfinished:
        engine.step()
    assert_greedy_equal(request.sequences[0].output_token_ids, theirs, logits, "resumed")
