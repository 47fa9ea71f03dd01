"""Engines the steps stand on: vector search (FAISS), the memory graph (igraph),
the LLM client and recall's ranking. They know nothing of Prefect, the store or the steps."""
