"""ComfyUI glue for lantern_core (V3 schema nodes).

The node set (loaders, sampler, decoder, stats UI) is being built in the node-pack issue; until it
lands this package registers no nodes, so installing the pack changes nothing in a ComfyUI graph.
"""
NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
WEB_DIRECTORY = "./web"
