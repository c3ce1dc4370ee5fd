"""What the GGUF tests share: the texts every tokenizer must encode as its original does."""

from __future__ import annotations

import tokenizers

from kestrel_trio.text import Tokenizer

__all__ = ["TEXTS", "assert_same_ids"]

TEXTS = [
    "Hello, world! How are you today?",
    "Digits: 7 42 123 4567 89012 3.14159 1,000,000 and 2024-06-01",
    "中文测试：你好，世界！今天天气很好。日本語のテキストも。한국어도",
    "Emoji 🙂😀🎉 🚀🦙🦙 ❤️ 👍🏽 family: 👨‍👩‍👧‍👦 flags 🇫🇷",
    "whitespace runs:  two   three    four\t\ttabs\n\n\nnewlines \r\n crlf   \n  trailing   ",
    "def add(a, b):\n    return a + b  # sum\n\nif __name__ == '__main__':\n    print(add(1, 22))\n",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like tea? We'Ve a'lL",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYes.<|im_end|>",
    "Ünïcödé ñ façade naïve — “quotes” … ﬁ ligature, combining é, ＦＵＬＬ ｗｉｄｔｈ",
    "------======= ''''''```````\"\"\"\"......!!!!!!??????",
    "",
]


def assert_same_ids(ours: Tokenizer, original: tokenizers.Tokenizer) -> None:
    """``ours`` encodes every text of TEXTS to the ids ``original`` gives, and decodes them back alike."""
    for text in TEXTS:
        want = original.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == want, text
        assert ours.decode(want, skip_special_tokens=False) == original.decode(want, skip_special_tokens=False)
