"""Where `import NAME` (argv[1]) resolves in this interpreter, found and not imported: a JSON list of the
package's folders ([] for a module that is no package), null where nothing is found."""

import importlib.util
import json
import sys

spec = importlib.util.find_spec(sys.argv[1])
print(json.dumps(list(spec.submodule_search_locations or []) if spec else None))
