"""What a running job can ask and tell: has it been cancelled, how far has it got."""
