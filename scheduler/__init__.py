"""gpuwarden scheduler: quota-aware placement that avoids sick GPU nodes."""
