"""Builds the tiny Llama models that the real-vLLM tests serve with dummy weights.

Usage: make_model.py OUT_DIR TEXT_FILE...

Writes OUT_DIR/tiny-llama (a plain chat model) and OUT_DIR/tiny-llama-think (the same model and
tokenizer, with a DeepSeek-R1-style chat template that opens a <think> block, for
`--reasoning-parser deepseek_r1`). No weights are written: vLLM serves them with
`--load-format dummy`. The tokenizer is a byte-level BPE trained here on TEXT_FILE (the repo's own
docs), so nothing is downloaded and the same input gives the same vocabulary.
"""

import json
import os
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 2048
# Neither <think> nor </think> is "special": vLLM strips special tokens from the text it returns,
# and the reasoning parser looks them up in the vocabulary by their text.
SPECIAL = ["<s>", "</s>"]
THINK = ["<think>", "</think>"]

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": VOCAB,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\n' + m['content'] + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
THINK_TEMPLATE = PLAIN_TEMPLATE.replace(
    "{{ '<|assistant|>\n' }}", "{{ '<|assistant|>\n<think>\n' }}"
)


def train(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(THINK),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in THINK])
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


def write(folder, tok, template):
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "</s>",
                "add_bos_token": False,
                "model_max_length": 2048,
                "chat_template": template,
            },
            f,
            indent=2,
        )


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv[1]
    texts = []
    for path in sys.argv[2:]:
        with open(path, encoding="utf-8", errors="replace") as f:
            texts.extend(f.read().splitlines())
    tok = train(texts)
    write(os.path.join(out, "tiny-llama"), tok, PLAIN_TEMPLATE)
    write(os.path.join(out, "tiny-llama-think"), tok, THINK_TEMPLATE)
    print(f"models in {out}: tiny-llama, tiny-llama-think (vocabulary {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
