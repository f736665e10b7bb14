"""The admin overview: the last hour of the system, drawn as charts from the database
(``sql`` reads, ``charts`` lays out the SVG, ``views`` serves the page)."""
