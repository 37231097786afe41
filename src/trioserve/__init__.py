"""trioserve: a production-grade agent server on Trio.

A drop-in replacement for ``agentctl serve`` v0.8: serve an ADL agent spec
over HTTP, run each turn's runtime adapter as a subprocess and stream its
wire events to the client as Server-Sent Events.
"""

__version__ = "0.1.0"
