"""What a run shows and leaves behind, shared by every command: run folders (``runs``), the
environment record (``env``), rich tables (``tables``), figures (``plots``, ``curves``) and the
paper's reference numbers (``paper``). Files are written through ``nyscli.files``."""
