"""The ``--json`` field names hy-smi prints, newest first where drivers differ.

Each constant is a tuple of candidates for parse.card_text / card_number, which take the
first one a card reports (see parse.py's docstring for which drivers print which).
"""

from __future__ import annotations

F_SERIES = ("Card Series", "Card SKU", "Card Model")
F_UNIQUE_ID = ("Unique ID", "Serial Number")
F_MEM_TOTAL_MIB = ("vram Total Memory (MiB)", "VRAM Total Memory (MiB)")
F_MEM_TOTAL_B = ("VRAM Total Memory (B)", "vram Total Memory (B)")
F_MEM_USED_MIB = ("vram Total Used Memory (MiB)", "VRAM Total Used Memory (MiB)")
F_MEM_USED_B = ("VRAM Total Used Memory (B)", "vram Total Used Memory (B)")
F_TEMP = (
    "Temperature (Sensor junction) (C)",
    "Temperature (Sensor edge) (C)",
    "Temperature (Sensor core) (C)",
)
F_POWER = (
    "Average Graphics Package Power (W)",
    "Current Socket Graphics Package Power (W)",
    "Average Package Power (W)",
)
F_USE = ("HCU use (%)", "DCU use (%)", "GPU use (%)")
F_POWER_CAP = ("Max Graphics Package Power (W)",)
F_SCLK = ("sclk clock speed:", "sclk clock speed")
