"""The spatial oracle at exactly the papers' settings (Oyama et al.: CosmoFlow 512^3, 3D U-Net 256^3),
on assumed or GPU-calibrated compute; nothing here is fitted to the published results.

    predictions     tables/paper_predictions.csv: the paper's hybrid and the oracle's free pick per setting,
                    per compute basis (assumed, mapped, calibrated), and its sensitivity to the assumptions
    compute_check   tables/compute_check.csv: the calibration's whole one-GPU steps against the oracle's
                    compute sum for the same slabs (claim compute_term)
    breakdown       tables/paper_breakdown.csv: the terms of each setting's time beside the published
                    speedups (resources/papers.yaml), and what a term would need to meet them
"""
