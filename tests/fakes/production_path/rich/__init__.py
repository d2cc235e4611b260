"""`import rich` fails in the proxy processes tests start, as it does where the proxy is installed.

The test virtualenv has rich only because import-linter needs it; structlog imports it when it is there
(about a tenth of a process start's CPU). `tests.fakes.process.child_environment` puts this folder first
on the children's path."""

raise ImportError("rich is not installed where registry-proxy runs (the test virtualenv has it for import-linter)")
