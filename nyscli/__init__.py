"""nys: reproduce and extend the Nyströmformer paper from one command line."""

__version__ = "0.1.0"
