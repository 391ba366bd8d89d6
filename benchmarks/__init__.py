"""Benchmarks, named by the question they answer: ``index`` lists each with its command, its
machine and where its results go (``results/``); ``device/drive.sh`` is the one driver of a GPU
machine; what they share with the tests is in the support package."""
