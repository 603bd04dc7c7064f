"""A tiny random-weight LLaVA checkpoint for tests: CLIP vision tower (32 x 32 images, 8 x 8 patches:
16 image tokens) + projector + a tiny Llama, saved with a CLIPImageProcessor and a byte-level BPE
tokenizer that has an `<image>` token, so the directory is what llava-hf ships (no downloads).

Weights are re-drawn as in hf_models.py (std 1/sqrt(fan_in)) so images change the output.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.support.hf_models import _randomize

IMAGE_TOKEN = "<image>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", IMAGE_TOKEN)  # ids 0..3
IMAGE_TOKEN_ID = 3
VOCAB_SIZE = 512
IMAGE_SIZE = 32
NUM_IMAGE_TOKENS = (IMAGE_SIZE // 8) ** 2  # "default" strategy: patches only
MAX_TOKENS = 10  # greedy tokens compared per request
# Content parts (LLaVA's convention) and plain strings both render.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pipeline.loading.default_model import load_corpus

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(load_corpus().splitlines(keepends=True)[:200], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=SPECIAL_TOKENS[0],
                                        bos_token=SPECIAL_TOKENS[0], pad_token=SPECIAL_TOKENS[0],
                                        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
                                        clean_up_tokenization_spaces=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_llava(path: str | Path, *, seed: int = 0, strategy: str = "default", feature_layer: Any = -2,
                    text_model_type: str = "llama") -> Path:
    """Write the checkpoint, tokenizer and preprocessor config to `path`; returns the path."""
    import transformers
    from transformers import CLIPVisionConfig, GenerationConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              image_size=IMAGE_SIZE, patch_size=8, projection_dim=16, hidden_act="quick_gelu")
    text_class = {"llama": "LlamaConfig", "qwen2": "Qwen2Config"}[text_model_type]
    text = getattr(transformers, text_class)(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=1024, rms_norm_eps=1e-6, bos_token_id=0,
                                             eos_token_id=0, tie_word_embeddings=False)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN_ID,
                         vision_feature_layer=feature_layer, vision_feature_select_strategy=strategy,
                         image_seq_length=NUM_IMAGE_TOKENS + (strategy == "full"), projector_hidden_act="gelu")
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).float().eval()
    _randomize(model, seed)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=0).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    image_processor().save_pretrained(path)
    return path


def image_processor() -> Any:
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE,
                                                                                "width": IMAGE_SIZE})


def random_image_bytes(seed: int, width: int = 48, height: int = 40, fmt: str = "PNG", mode: str = "RGB") -> bytes:
    """A random picture of the given size, encoded (PNG keeps it exact; JPEG is lossy)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = len(mode)
    pixels = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    image = Image.fromarray(pixels if channels > 1 else pixels[..., 0], mode=mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def solid_image_bytes(width: int, height: int, color: tuple[int, int, int] = (200, 30, 90)) -> bytes:
    """A one-colour PNG: many pixels in few bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


class HFReference:
    """HF LlavaProcessor + LlavaForConditionalGeneration.generate, greedy."""

    def __init__(self, model_dir: Path, strategy: str = "default") -> None:
        from transformers import AutoTokenizer, LlavaForConditionalGeneration, LlavaProcessor

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.processor = LlavaProcessor(image_processor=image_processor(), tokenizer=self.tokenizer, patch_size=8,
                                        vision_feature_select_strategy=strategy, num_additional_image_tokens=1,
                                        image_token=IMAGE_TOKEN)
        self.model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()

    def generate(self, prompt: str, images: list[bytes]) -> tuple[list[int], list[int], torch.Tensor]:
        """(prompt ids, greedy output ids, logits per output position)."""
        from PIL import Image

        pictures = [Image.open(io.BytesIO(data)) for data in images] or None
        inputs = self.processor(text=prompt, images=pictures, return_tensors="pt")
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None,
                                      pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        prompt_ids = inputs["input_ids"][0].tolist()
        return prompt_ids, out.sequences[0, len(prompt_ids):].tolist(), torch.cat(out.logits).float()
