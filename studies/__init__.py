"""Studies run with biprm, kept beside the library: each a folder with its code, its config files, its results and a
README, run as `python -m studies.<name> --config studies/<name>/<file>.yaml`. The library never imports them."""
