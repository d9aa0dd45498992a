"""Streaming-safe output parsers: reasoning blocks and tool calls."""
