"""Which model files a launch gets when the user names no file.

- ``presetchoice``: every preset planned for a machine, and the one `up` picks; ``repoplan``: a
  repo named by name, every quant planned; ``quantchoice``: the quant it serves.
"""
