"""The built-in offline text for ``source=minilm`` when no ``data.path`` is given.

Original prose written for this project (no licence restrictions), about 800 words of plain
English on an everyday subject, so that the model sees ordinary sentences rather than code or
markup. Tokenised for the MiniLM model it is about 900 WordPiece tokens: two sequences of at
most 512 tokens, the second one shorter and padded, so the run exercises real padding masks.
"""

SAMPLE_TEXT = """\
The old lighthouse on the northern cape was switched off for the last time on a grey morning in
early spring. For more than a century it had turned its slow white beam across the water, four
flashes every twenty seconds, and the fishing families in the village below had set their
clocks, their suppers and their worries by it. Nobody in the village could remember a night
without it. The keeper's cottage had been empty for decades, since the lamp was automated, but
children still told each other that someone climbed the spiral stairs at midnight to polish the
great glass lens.

The decision to close it came from an office far away. Ships now carried satellite receivers
that told them their position to within a few metres, and a light that could be seen for twenty
miles had become, in the language of the report, a redundant aid to navigation. The report was
polite and carefully argued. It listed the costs of maintenance, the price of the electricity,
the repairs that the tower would need within ten years, and the number of vessels that had
reported using the light in the previous season, which was small.

The people of the village read the report in the community hall, where a copy had been pinned
beside the notices for the summer fair and the lost dog. Some of them agreed with it. The younger
fishermen trusted their screens more than any lamp, and they pointed out that the money could
pay for a new breakwater, which the harbour badly needed. The older ones were less certain. A
receiver, they said, can fail, a battery can run flat, and a storm does not care what the
satellites are doing. A light on a headland asks nothing of the sailor except that he look up.

In the end the village did what villages often do: it formed a committee. The committee met on
Thursday evenings in the back room of the bakery, where the air smelled of flour and warm sugar.
Its members wrote letters, collected signatures and drew up a plan. If the authority would not
keep the light as a working aid, perhaps it would lease the tower to the village for a token
sum, and the village would look after it as a museum, a landmark and, on certain nights of the
year, a beacon.

The plan took two years to agree. There were questions about insurance, about who would climb
the tower to change the bulbs, about whether a light that was not an official aid to navigation
might confuse a stranger at sea. A retired engineer who had moved to the village to paint
watercolours turned out to know a great deal about lenses, and he became, without ever quite
volunteering, the unofficial keeper. He cleaned the brass, oiled the turning gear and taught a
group of schoolchildren how the prisms bent the light of a small lamp into a beam that could
cross the bay.

Visitors began to come. At first there were only a few walkers on the coastal path, who found
the door open on Saturday afternoons and climbed the one hundred and twelve steps to the lantern
room. Then a newspaper printed a photograph of the tower against a winter sunset, and the
numbers grew. The bakery sold more bread than it had in years. A family opened a small cafe in
the former coal store. The committee used the entrance fees to repair the roof of the keeper's
cottage, and later to turn it into a room where the children's drawings of ships and storms
were hung along the walls.

On the longest night of the year the village now lights the lamp again. It is not an official
light, and the notice to mariners says so in plain words. But for one night the beam turns over
the water as it used to, four flashes every twenty seconds, and people stand on the harbour wall
with flasks of tea to watch it. The fishermen who once argued for the breakwater stand with
them. The breakwater was built in the end, paid for by a grant that nobody had expected, and the
harbour is calmer for it.

When people ask the engineer why the village went to so much trouble over a lamp that no ship
needs, he usually answers with a story about his first voyage as a young man, when the radio
failed off a strange coast and a light on a headland showed his captain where the rocks were.
Then he shrugs and says that the reason does not really matter. A place needs something to look
after, he says, and something that looks after it in return, even if that is only a light going
round in the dark.
"""
