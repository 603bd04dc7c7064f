"""Write a random-weight HF Llama of a chosen size (for benchmarks; no tokenizer: token-id prompts).

    python benchmarks/make_llama.py -o /tmp/llama70m --hidden 512 --layers 12 --heads 8 --kv-heads 4 \
        --intermediate 1536 --vocab 32000
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(args.output, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.output}: {params / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
