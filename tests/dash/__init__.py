"""Console pages: figure builders, data queries, callbacks, the browser test."""
