"""Generation: seeded, paired videos and their exact compute.

``generate`` loads a pipeline once per worker and renders one candidate; ``armrun`` runs
an arm for one pair (its pipeline, a search's candidates); ``compute`` counts block
forwards and FLOPs; ``provenance`` says how a record was made; ``tinymodel`` builds the
embedded tiny pipelines."""
