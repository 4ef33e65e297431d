"""The demo's transcript generator (`corpus`) and the vocabulary it draws from (data)."""
