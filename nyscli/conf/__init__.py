"""The Hydra configs of every ``nys`` command (read as ``pkg://nyscli.conf``, so they ship in
the wheel). No code: this file only makes the folder a package Hydra can find."""
