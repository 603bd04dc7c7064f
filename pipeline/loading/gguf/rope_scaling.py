"""Llama-3 rope scaling from a GGUF `rope_freqs` tensor.

llama.cpp does not store Llama 3.1's rope_scaling settings; convert_hf_to_gguf.py stores the
per-frequency divisors they produce (`rope_freqs`, head_dim / 2 values): 1 for short wavelengths,
`factor` for long ones, and a smooth blend in between. HF needs the settings back. They are
recoverable up to a common scale of (low_freq_factor, high_freq_factor, original context), which
changes nothing, so low_freq_factor is fixed at 1 and the rest is solved from the blend band, then
checked by recomputing the divisors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_TOLERANCE = 1e-4  # rope_freqs is float32; the check allows its rounding and nothing more
_LOW_FREQ_FACTOR = 1.0
_DEFAULT_HIGH_FREQ_FACTOR = 4.0  # Llama 3.1's, used when the blend band has too few points to solve


def llama3_divisors(inv_freq: np.ndarray, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_context: float) -> np.ndarray:
    """What llama.cpp stores in rope_freqs (and HF applies as inv_freq / divisor)."""
    wavelen = 2 * math.pi / inv_freq
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = 1.0 / ((1.0 - smooth) / factor + smooth)
    divisors = np.where(wavelen < original_context / high_freq_factor, 1.0, blended)
    return np.where(wavelen > original_context / low_freq_factor, factor, divisors)


def llama3_rope_scaling(rope_freqs: np.ndarray, theta: float, head_dim: int) -> dict[str, Any] | None:
    """HF's `rope_scaling` dict reproducing `rope_freqs`; None when every divisor is 1.

    ValueError when no llama3 setting reproduces them (some other scaling we cannot represent).
    """
    divisors = rope_freqs.astype(np.float64).reshape(-1)
    if divisors.shape[0] != head_dim // 2:
        raise ValueError(f"rope_freqs has {divisors.shape[0]} values, expected head_dim / 2 = {head_dim // 2}")
    if np.allclose(divisors, 1.0, rtol=0, atol=_TOLERANCE):
        return None
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor = float(divisors.max())
    high_freq_factor, original_context = _solve_band(divisors, inv_freq, factor)
    if not (original_context >= 1 and high_freq_factor > _LOW_FREQ_FACTOR):
        raise ValueError("this GGUF's rope_freqs tensor is not llama3-style rope scaling")
    expected = llama3_divisors(inv_freq, factor, _LOW_FREQ_FACTOR, high_freq_factor, original_context)
    if not np.allclose(expected, divisors, rtol=_TOLERANCE, atol=0):
        raise ValueError("this GGUF's rope_freqs tensor is not llama3-style rope scaling, which is the only "
                         "per-frequency scaling supported")
    return {"rope_type": "llama3", "factor": _snap(factor), "low_freq_factor": _LOW_FREQ_FACTOR,
            "high_freq_factor": _snap(high_freq_factor), "original_max_position_embeddings": int(original_context)}


def _solve_band(divisors: np.ndarray, inv_freq: np.ndarray, factor: float) -> tuple[float, float]:
    """(high_freq_factor, original context) for low_freq_factor 1.

    In the band 1/d = (1 - s)/factor + s with s = (context / wavelen - low) / (high - low): s is
    linear in 1/wavelen, slope context / (high - low) and intercept -low / (high - low).
    """
    reciprocal_wavelen = inv_freq / (2 * math.pi)
    band = (divisors > 1.0 + _TOLERANCE) & (divisors < factor * (1.0 - _TOLERANCE))
    smooth = (1.0 / divisors[band] - 1.0 / factor) / (1.0 - 1.0 / factor)
    if band.sum() >= 2:
        slope, intercept = np.polyfit(reciprocal_wavelen[band], smooth, 1)
        if intercept >= 0:
            raise ValueError("this GGUF's rope_freqs tensor is not llama3-style rope scaling")
        high = 1.0 - 1.0 / intercept
        return high, _snap(slope * (high - 1.0))
    high = _DEFAULT_HIGH_FREQ_FACTOR
    if band.sum() == 1:
        context = (smooth[0] * (high - 1.0) + 1.0) / reciprocal_wavelen[band][0]
        return high, _snap(context)
    # No point in the band: any context whose band falls between the last kept and the first scaled
    # wavelength gives the same divisors.
    wavelen = 1.0 / reciprocal_wavelen
    longest_kept = wavelen[divisors <= 1.0 + _TOLERANCE].max(initial=0.0)
    shortest_scaled = wavelen[divisors >= factor * (1.0 - _TOLERANCE)].min(initial=math.inf)
    return high, float(math.ceil(math.sqrt(high * longest_kept * shortest_scaled)))


def _snap(value: float) -> float:
    """The nearest integer when within float32 rounding of it: configs state 8.0, not 7.99999."""
    nearest = round(value)
    return float(nearest) if abs(value - nearest) <= _TOLERANCE * max(1.0, abs(value)) else float(value)
