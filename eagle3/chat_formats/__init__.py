"""Chat formats of real targets: their control tokens and the codec of an assistant turn.

`kimi`: Kimi-K2.5's (the flagship target, and the format the demo target is trained in).
"""
