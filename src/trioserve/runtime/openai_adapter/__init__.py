"""The built-in ``openai`` runtime adapter: an ADL agent on any OpenAI-compatible model server.

Run as ``python -m trioserve.runtime.openai_adapter [--preload-mcp]``.  Like
every adapter it reads one CompiledSpec on stdin and prints wire events on
stdout (docs/wire-protocol.md, "openai"): the persona is the system
message, the session's earlier turns (which the server adds under
``trioserve.history``) come next, the turn's input is the user's message;
the reply streams as ``message`` events; the tools of ``spec.mcpServers``
(``stdio``) are offered to the model and run; every failure is an
``error`` event with a reason, then ``session.ended`` ``error``.  SIGINT or
SIGTERM cancels the turn: its MCP servers are stopped and it ends with
``session.ended`` ``cancelled``.

Modules: ``__main__`` (start-up: signals, stdin, the event loop),
``_adapter`` (a turn's run and how it ends), ``_turn`` (rounds of model
and tools), ``_conversation`` (messages and the history budget),
``_client`` and ``_stream`` (the HTTP request and its stream), ``_errors``
(the server's refusals), ``_mcp`` (MCP servers and tools), ``_settings``
(environment and options), ``_events`` (printing events).
"""
