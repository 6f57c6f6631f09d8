"""The built-in prompt set: three prompts for each of six categories, written for this project.

Three categories are *input-grounded* (code editing, summarisation, question answering over a
passage): the answer reuses the prompt's text, which n-gram drafting can copy. Identifiers are
assigned by ``bench/prompts.py``.
"""

from __future__ import annotations

_INVENTORY_CODE = '''\
def restock(items, threshold, supplier):
    orders = []
    for item in items:
        if item["count"] < threshold:
            missing = threshold - item["count"]
            orders.append({"sku": item["sku"], "qty": missing, "from": supplier})
    total = 0
    for order in orders:
        total = total + order["qty"]
    print("ordering", total, "units")
    return orders
'''

_PARSER_CODE = '''\
def parse_line(line):
    parts = line.split(",")
    name = parts[0]
    age = int(parts[1])
    city = parts[2]
    return {"name": name, "age": age, "city": city}


def parse_file(path):
    rows = []
    f = open(path)
    for line in f.readlines():
        rows.append(parse_line(line))
    return rows
'''

_STATS_CODE = '''\
class RunningStats:
    def __init__(self):
        self.n = 0
        self.total = 0.0
        self.total_sq = 0.0

    def add(self, x):
        self.n += 1
        self.total += x
        self.total_sq += x * x

    def mean(self):
        return self.total / self.n

    def variance(self):
        return self.total_sq / self.n - self.mean() ** 2
'''

_LIGHTHOUSE = (
    "The lighthouse on Carrow Point was switched off in 1987, after ninety-one years of "
    "service. Its keepers had been withdrawn a decade earlier, when an automatic lamp and a "
    "diesel generator replaced the paraffin burner that three generations of the Ellery family "
    "had tended. The automatic lamp proved unreliable in winter storms, and after two "
    "fishing boats ran aground in the fog of 1985, the harbour board voted to replace the "
    "lighthouse with a radio beacon on the breakwater. The tower itself was sold to the town "
    "for one pound. For twenty years it stood empty, its paint peeling and its iron gallery "
    "rusting in the salt air. In 2009 a group of volunteers, led by a retired schoolteacher "
    "named Margaret Ellery, the granddaughter of the last keeper, raised money to repair the "
    "roof and the stairs. The tower reopened as a small museum in 2012. It now holds the "
    "original lens, which was found in a warehouse in Glasgow, along with the keepers' log "
    "books, which record every ship that passed the point between 1896 and 1977."
)

_BEES = (
    "Honey bees regulate the temperature of their brood nest with remarkable precision. "
    "The developing larvae and pupae must be kept between 34 and 36 degrees Celsius; a few "
    "degrees outside that range and the adult bees that emerge are smaller, learn more "
    "slowly, or fail to develop at all. When the nest is too cold, worker bees cluster on "
    "the comb and shiver their flight muscles without moving their wings, which produces "
    "heat. Some workers, called heater bees, press their warm bodies into empty cells "
    "between the capped brood and can stay there for up to thirty minutes. When the nest is "
    "too hot, workers fan their wings at the entrance to draw air through the hive, and "
    "foragers bring back water, which they spread in thin films over the comb so that it "
    "cools the nest as it evaporates. A strong colony can hold its brood temperature within "
    "half a degree while the air outside changes by twenty degrees in a single day."
)

_CANAL = (
    "Minutes of the Ashford Canal Trust, meeting of 14 March. Present: the chair, the "
    "treasurer, the secretary and six members. The treasurer reported that the trust ended "
    "the year with 18,400 pounds in the bank, of which 6,000 pounds is reserved for the "
    "repair of lock gate number four. Income from boat licences rose by twelve percent, "
    "while income from the summer fair fell by a third because of the rain. The secretary "
    "reported that the council has agreed to cut back the hedges along the towpath in "
    "April, but will not pay for new signs. The members discussed whether to raise the "
    "licence fee. Mr Dunmore proposed a rise of five pounds; Ms Okafor argued that the "
    "rise would drive away the smaller boats and proposed no rise this year. The vote was "
    "five to four against the rise. The chair thanked the volunteers who cleared the "
    "overflow channel in February. The next meeting will be held on 9 May at the lock "
    "keeper's cottage."
)

_RAIL = (
    "The Velden mountain railway climbs 1,240 metres in eleven kilometres, which makes it "
    "one of the steepest adhesion railways in Europe. It was built between 1898 and 1904 "
    "by a private company that hoped to carry timber down from the upper valley. The "
    "timber trade collapsed within a few years, but tourists began to arrive in large "
    "numbers, and by 1910 the railway carried more passengers than freight. The line was "
    "electrified in 1926, using power from a small hydroelectric plant at the foot of the "
    "Grauen waterfall. In the winter of 1951 an avalanche destroyed the bridge at "
    "Steinach, and the upper section stayed closed for two years while a new concrete "
    "bridge was built. Today the railway runs six trains a day in summer and three in "
    "winter. The journey takes fifty-five minutes, and the original 1926 locomotive, "
    "number 3, still pulls the first train of the season every May."
)

BUILTIN: list[tuple[str, str]] = [
    # Code editing: the answer is the given code, changed a little.
    ("code_editing",
     "Rename the function `restock` to `plan_restock` and the variable `missing` to "
     "`shortfall`, replace the second loop with a call to `sum`, and return the complete "
     "edited code.\n\n```python\n" + _INVENTORY_CODE + "```"),
    ("code_editing",
     "Add type hints to every function below, use a `with` block to open the file, and "
     "skip empty lines. Return the full updated code.\n\n```python\n" + _PARSER_CODE + "```"),
    ("code_editing",
     "Add a docstring to the class and to each method below, and make `mean` and `variance` "
     "return 0.0 when no value has been added. Return the whole class.\n\n```python\n"
     + _STATS_CODE + "```"),
    # Summarisation of a given passage.
    ("summarization",
     "Summarise the following text in three sentences.\n\n" + _LIGHTHOUSE),
    ("summarization",
     "Summarise the following passage for a ten-year-old reader.\n\n" + _BEES),
    ("summarization",
     "Write a short summary of these meeting minutes, listing each decision taken.\n\n"
     + _CANAL),
    # Question answering over a given passage.
    ("qa_over_text",
     _LIGHTHOUSE + "\n\nUsing only the text above, answer: who led the volunteers, how "
     "is she related to the keepers, and what does the museum hold?"),
    ("qa_over_text",
     _RAIL + "\n\nAccording to the passage, why was the upper section closed in 1951, for "
     "how long, and which locomotive pulls the first train of the season?"),
    ("qa_over_text",
     _CANAL + "\n\nBased on the minutes above, how much money is reserved for lock gate "
     "number four, who proposed the fee rise, and what was the result of the vote?"),
    # Translation.
    ("translation",
     "Translate into French: The library opens at nine in the morning and closes at six "
     "in the evening, except on Sundays, when it stays closed all day."),
    ("translation",
     "Translate into German: My brother bought a second-hand bicycle last week, but the "
     "brakes do not work, so he is taking it back to the shop tomorrow."),
    ("translation",
     "Translate into Spanish: Please water the tomatoes every evening while I am away, "
     "and pick any that are already red."),
    # Maths reasoning.
    ("math_reasoning",
     "A baker makes 240 rolls. She sells three quarters of them in the morning and half "
     "of the rest in the afternoon. How many rolls are left? Explain each step."),
    ("math_reasoning",
     "A train leaves at 08:40 and travels 195 kilometres at an average speed of 78 "
     "kilometres per hour. At what time does it arrive? Show your working."),
    ("math_reasoning",
     "The sum of three consecutive even numbers is 138. What are the numbers? Reason "
     "step by step."),
    # Open chat.
    ("chat",
     "I have a free Saturday and a small budget. Suggest a relaxing plan for the day."),
    ("chat",
     "What are some good habits for someone who is learning to play the guitar?"),
    ("chat",
     "Write a short, friendly message inviting my neighbours to a garden party."),
]

# Categories whose answers mostly reuse text from the prompt.
GROUNDED_CATEGORIES = frozenset({"code_editing", "summarization", "qa_over_text", "rag"})
