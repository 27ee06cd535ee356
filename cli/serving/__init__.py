"""Serving: `tf serve`'s HTTP application, the batcher that searches concurrent requests in
whole groups, and the search processes it feeds on CPUs.
"""
