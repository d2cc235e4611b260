"""Settings: how options are declared, the table of options, where each value comes from (flags,
environment, `--config`), and the configuration reference rendered from the same declarations."""
