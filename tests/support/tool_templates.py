"""Chat templates in the shapes of real families' tool syntax, written here (no hub): Qwen3's Hermes calls with
results in a user turn, Llama 3's JSON calls with an ``ipython`` turn, and Gemma 3's, which knows no tools and
refuses any role but the user's and the model's."""

QWEN3_SHAPED = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}{%- if m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_SHAPED = (
    "{{ bos_token }}{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    '{% for t in tools %}{{ t | tojson }}\n{% endfor %}Call one as {"name": ..., "parameters": {...}}<|eot_id|>{% endif %}'
    "{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
GEMMA3_SHAPED = (
    "{{ bos_token }}{%- for m in messages %}{%- if m.role not in ['user', 'assistant'] %}"
    "{{ raise_exception('Conversation roles must be user or assistant') }}{%- endif %}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
TEMPLATES = {"qwen3": QWEN3_SHAPED, "llama": LLAMA3_SHAPED, "gemma3_text": GEMMA3_SHAPED}
"""Each family's template, by its ``model_type``."""
SPECIALS = {
    "qwen3": ["<|im_start|>", "<|im_end|>"],
    "llama": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "gemma3_text": ["<start_of_turn>", "<end_of_turn>"],
}
"""The special tokens each template writes, one token each as in the families' tokenizers."""
CALL_TAGS = {"qwen3": ["<tool_call>", "</tool_call>"], "llama": ["}}"], "gemma3_text": ["<tool_call>", "</tool_call>"]}
"""Tokens of the call syntax, added but not special (a completion's text keeps them): Qwen's tags, as its tokenizer has
them, and the closing braces of a JSON call, one token in Llama 3's vocabulary."""
