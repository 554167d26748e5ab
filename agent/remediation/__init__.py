"""The agent's half of remediation: GPU resets and validations asked for on the GPUNode."""
